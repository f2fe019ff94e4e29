"""kernels/space_to_depth.py and the triton_int8_conv_s2d tactic: a stride-2 conv on few channels (ResNet's 7x7
stem) as space-to-depth + a stride-1 conv on 16 channels (run as a KHx1 conv of S's overlapping row view) gives
the reference's bits (the same integer sums); under TRITON_INTERPRET=1 on the CPU."""

import pytest
import torch
import torch.nn.functional as F

from kiln.kernels import space_to_depth
from test_kernels_int8 import CPU, EPI, _i8, _spec

STEMS = [  # C, H, W, kernel, pads (top, left, bottom, right)
    (3, 16, 16, 7, (3, 3, 3, 3)),
    (3, 11, 9, 7, (3, 3, 3, 3)),
    (2, 8, 10, 3, (1, 0, 1, 1)),
    (4, 9, 9, 4, (1, 1, 2, 2)),
]


@pytest.mark.parametrize("c,h,w,k,pads", STEMS)
def test_space_to_depth_conv_equals_the_strided_conv(c, h, w, k, pads):
    g = torch.Generator().manual_seed(k)
    x, wt = torch.randn(2, c, h, w, generator=g), torch.randn(5, c, k, k, generator=g)
    want = F.conv2d(F.pad(x, (pads[1], pads[3], pads[0], pads[2])), wt, stride=2)
    k2, size = space_to_depth.geometry((k, k), tuple(want.shape[2:]))
    s = space_to_depth.space_to_depth(x, pads[:2], size, 16)
    assert s.shape == (2, 16, *size) and s.is_contiguous(memory_format=torch.channels_last)
    got = F.conv2d(s, space_to_depth.weight(wt, 16))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    view = space_to_depth.rows(s, k2[1])  # the overlapping row view: a KHx1 conv of it is the same conv
    w_rows = space_to_depth.row_weight(space_to_depth.weight(wt, 16))
    assert view.shape == (2, 16 * k2[1], size[0], want.shape[3]) and w_rows.shape[2:] == (k2[0], 1)
    torch.testing.assert_close(F.conv2d(view.contiguous(), w_rows), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c,h,w,k,pads", STEMS[:3])
def test_s2d_tactic_is_bit_exact(c, h, w, k, pads):
    from kiln.tactics import registry
    g = torch.Generator().manual_seed(10 + k)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [k, k], "pads": list(pads),
             "strides": [2, 2], "x_scale": 0.1, "out_scale": 0.5} | EPI | {"activation": "Relu"}
    inputs = [_i8(g, 2, c, h, w), _i8(g, 24, c, k, k), torch.rand(24, generator=g) * 1e-3 + 1e-4,
              torch.randn(24, generator=g)]
    spec, args, want = _spec("QuantConv", attrs, inputs)
    t = registry.get("triton_int8_conv_s2d")
    assert t.supports(spec, CPU) is None
    configs = t.configs(spec, CPU, 2)
    assert configs and all(cfg["layout"] == "nhwc" for cfg in configs)
    for cfg in configs[:2]:
        got = t.compile(spec, cfg, CPU)(args)[0]
        assert got.dtype == want.dtype and torch.equal(got, want), cfg


def test_s2d_tactic_refuses_other_convs():
    from kiln.tactics import registry
    g = torch.Generator().manual_seed(3)
    base = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1] * 4,
            "x_scale": 0.1, "out_scale": 0.5} | EPI
    t = registry.get("triton_int8_conv_s2d")
    wide, _, _ = _spec("QuantConv", base | {"strides": [2, 2]}, [_i8(g, 1, 8, 8, 8), _i8(g, 4, 8, 3, 3),
                                                                 torch.ones(4), None])
    assert "input channels" in t.supports(wide, CPU)
    flat, _, _ = _spec("QuantConv", base | {"strides": [1, 1]}, [_i8(g, 1, 3, 8, 8), _i8(g, 4, 3, 3, 3),
                                                                 torch.ones(4), None])
    assert "stride 2" in t.supports(flat, CPU)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_space_to_depth_moves_quantized_values_unchanged(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-100, 100, (1, 3, 7, 9), generator=g).to(torch.float32)
    s = space_to_depth.space_to_depth(x.to(dtype).contiguous(memory_format=torch.channels_last), (3, 3), (6, 7), 16)
    assert s.dtype == dtype and torch.equal(s.float(), space_to_depth.space_to_depth(x.to(dtype).float(), (3, 3),
                                                                                      (6, 7), 16))


def test_space_to_depth_puts_each_pixel_at_its_channel():
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-100, 100, (2, 3, 9, 8), generator=g).to(torch.int8)
    s = space_to_depth.space_to_depth(x, (1, 2), (5, 6))
    for c in range(4):
        for dy in range(2):
            for dx in range(2):
                want = torch.zeros(2, 5, 6, dtype=torch.int8)
                for i in range(5):
                    for j in range(6):
                        h, w = 2 * i + dy - 1, 2 * j + dx - 2
                        if c < 3 and 0 <= h < 9 and 0 <= w < 8:
                            want[:, i, j] = x[:, c, h, w]
                assert torch.equal(s[:, space_to_depth.channel(c, dy, dx)], want), (c, dy, dx)
    assert sorted(space_to_depth.channel(c, dy, dx) for c in range(4) for dy in range(2) for dx in range(2)) == \
        list(range(16))


def test_space_to_depth_refuses_more_than_four_channels():
    with pytest.raises(ValueError, match="at most 4"):
        space_to_depth.space_to_depth(torch.zeros(1, 5, 4, 4, dtype=torch.int8), (0, 0), (2, 2))
