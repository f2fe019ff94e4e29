"""The CUDA-core convolutions (triton_depthwise_conv, triton_direct_conv for few input channels) against the Conv /
FusedConv references.

On the CPU the kernels run under TRITON_INTERPRET=1 at tiny shapes; the gpu tests run MobileNetV2's shapes.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.kernels import conv, depthwise_conv, direct_conv  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.target.device import Device  # noqa: E402

from test_kernels_conv import _check, _spec  # noqa: E402  (the Conv tests' spec and tolerance check)

CPU = Device("cpu", "cpu", "cpu")
SMALL = {"layout": "nhwc", "BLOCK_P": 16, "BLOCK_C": 8, "num_warps": 2, "TILE_W": 0, "BLOCK_R": 0, "TMA_STAGES": 0}
TACTIC = registry.get("triton_depthwise_conv")
DIRECT = registry.get("triton_direct_conv")
SMALL_DIRECT = {"layout": "nhwc", "BLOCK_P": 16, "BLOCK_N": 16, "num_warps": 2, "DOT": 0}


def _attrs(c, k=3, stride=1, pads=(1, 1, 1, 1), dilation=1, **extra):
    return {"kernel_shape": [k, k], "strides": [stride, stride], "dilations": [dilation, dilation],
            "pads": list(pads), "group": c, "auto_pad": "NOTSET", **extra}


@pytest.mark.parametrize("k, stride, pads, dilation", [(3, 1, (1, 1, 1, 1), 1), (3, 2, (0, 1, 2, 0), 1),
                                                        (3, 1, (2, 2, 2, 2), 2), (5, 2, (2, 2, 2, 2), 1)])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("c", [12, 16])
@pytest.mark.parametrize("tile_w", [0, 4])
def test_matches_reference(k, stride, pads, dilation, channels_last, c, tile_w):
    """Strides, asymmetric pads and dilation on NCHW and channels_last inputs; 12 channels cut the 8-channel tiles
    (16 fill them: the kernel's unmasked channel path) and the pixels cut the 16-pixel tiles, flat runs or 4×4
    patches (TILE_W 4) that cut the output's rows and columns."""
    g = torch.Generator().manual_seed(k * 10 + stride)
    x = torch.randn(2, c, 9, 11, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    inputs = [x, torch.randn(c, 1, k, k, generator=g), torch.randn(c, generator=g)]
    spec, want = _spec("Conv", _attrs(c, k, stride, pads, dilation), inputs)
    assert TACTIC.supports(spec, CPU) is None
    _check(TACTIC.compile(spec, dict(SMALL, TILE_W=tile_w), CPU)(inputs)[0], want)


@pytest.mark.parametrize("act, params, residual", [("Clip", [0.0, 6.0], False), ("Relu", [], True),
                                                   ("none", [], True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_with_residual_and_activation(act, params, residual, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 20, 6, 7, generator=g).to(dtype)
    w, b = torch.randn(20, 1, 3, 3, generator=g).to(dtype), torch.randn(20, generator=g).to(dtype)
    inputs = [x, w, b] + ([torch.randn(1, 20, 6, 7, generator=g).to(dtype)] if residual else [])
    spec, want = _spec("FusedConv", _attrs(20, residual=residual, activation=act, activation_params=params), inputs)
    assert TACTIC.supports(spec, CPU) is None
    assert all(c["layout"] == "nhwc" for c in TACTIC.configs(spec, CPU, 3))
    _check(TACTIC.compile(spec, SMALL, CPU)(inputs)[0], want)


def test_without_bias_and_default_config():
    x, w = torch.randn(1, 6, 8, 8), torch.randn(6, 1, 3, 3)
    want = torch.nn.functional.conv2d(x, w, padding=1, groups=6)
    _check(depthwise_conv.depthwise_conv2d(x, depthwise_conv.pack_weight(w), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
           want)


def test_only_depthwise():
    x = torch.randn(1, 4, 6, 6)
    spec, _ = _spec("Conv", _attrs(2), [x, torch.randn(4, 2, 3, 3)])  # two channels a group
    assert "depthwise" in TACTIC.supports(spec, CPU)
    assert "grouped" in DIRECT.supports(spec, CPU)
    spec, _ = _spec("Conv", _attrs(1), [x, torch.randn(4, 4, 3, 3)])  # dense
    assert "depthwise" in TACTIC.supports(spec, CPU)
    assert DIRECT.supports(spec, CPU) is None
    spec, _ = _spec("Conv", _attrs(1), [torch.randn(1, 5, 6, 6), torch.randn(4, 5, 3, 3)])  # 45 taps
    assert "taps" in DIRECT.supports(spec, CPU)


def test_depthwise_configs_fit_the_output_width():
    """Patches no wider than the output (7 columns: 4 or 8), flat runs offered first, every config unique."""
    many = depthwise_conv.configs(64 * 7 * 7, 960, 5, ow=7)
    assert many[0]["TILE_W"] == 0 and all(c["TILE_W"] <= 8 for c in many)
    assert any(c["TILE_W"] for c in many) and len({tuple(c.values()) for c in many}) == len(many)
    spec, _ = _spec("Conv", _attrs(1, 7, 2, (3, 3, 3, 3)), [torch.randn(1, 3, 9, 9), torch.randn(4, 3, 7, 7)])
    assert "taps" in DIRECT.supports(spec, CPU)  # ResNet-50's stem


def test_depthwise_row_sweeps_offered_where_they_apply():
    """3x3 convs of stride 1 or 2 get row sweeps, TMA ones where 16-byte channel rows allow (leading from 65,536
    output pixels, after every flat run and patch under that); a 5x5 or dilated conv gets none."""
    def tiles(c, k=3, stride=1, dilation=1, dtype=torch.float16, batch=400):
        x = torch.randn(batch, c, 14, 14).to(dtype)
        spec, _ = _spec("Conv", _attrs(c, k, stride, (1, 1, 1, 1), dilation), [x, torch.randn(c, 1, k, k).to(dtype)])
        return TACTIC.configs(spec, CPU, 4)

    first = tiles(64)[0]
    assert first["TMA_STAGES"] and first["BLOCK_R"] and first["BLOCK_P"] <= 16  # 14 columns
    few = tiles(64, batch=1)  # 196 output pixels: every flat run and patch before the sweeps
    assert not few[0]["BLOCK_R"] and few[-1]["BLOCK_R"]
    assert any(c["BLOCK_R"] and not c["TMA_STAGES"] for c in tiles(64))
    at2 = tiles(64, stride=2, batch=1400)  # 68,600 output pixels
    assert at2[0]["BLOCK_R"] and at2[0]["TMA_STAGES"] and not at2[-1]["TMA_STAGES"]  # TMA first at stride 2 too
    assert not any(c["TMA_STAGES"] for c in tiles(12))  # 24-byte channel rows
    assert not any(c["BLOCK_R"] for c in tiles(64, k=5) + tiles(64, dilation=2))
    with pytest.raises(ValueError, match="row-sweep"):
        depthwise_conv.depthwise_conv2d(torch.randn(1, 8, 6, 6), depthwise_conv.pack_weight(torch.randn(8, 1, 5, 5)),
                                        (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), config=dict(first, BLOCK_C=8))


@pytest.mark.parametrize("stride, pads", [(1, (1, 1, 1, 1)), (2, (1, 1, 1, 1)), (1, (0, 1, 2, 0)), (2, (0, 1, 2, 0))])
@pytest.mark.parametrize("tma", [0, 2])
@pytest.mark.parametrize("c, channels_last", [(16, True), (12, True), (16, False)])
def test_row_sweeps_match_reference(stride, pads, tma, c, channels_last):
    """Row sweeps down bands of 4 rows (the last cut) over tiles of 4 columns: stride 1 and 2, asymmetric pads, a
    residual; TMA loads where the input allows (16 channels, channels_last; at stride 2 boxes of 8 columns split into
    even and odd), pointer loads elsewhere."""
    g = torch.Generator().manual_seed(stride * 10 + c)
    x = torch.randn(2, c, 9, 11, generator=g).half()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    oh, ow = (9 + pads[0] + pads[2] - 3) // stride + 1, (11 + pads[1] + pads[3] - 3) // stride + 1
    inputs = [x, torch.randn(c, 1, 3, 3, generator=g).half(), torch.randn(c, generator=g).half(),
              torch.randn(2, c, oh, ow, generator=g).half()]
    spec, want = _spec("FusedConv", _attrs(c, 3, stride, pads, residual=True, activation="Relu",
                                           activation_params=[]), inputs)
    config = dict(SMALL, BLOCK_P=4, TILE_W=0, BLOCK_R=4, TMA_STAGES=tma)
    _check(TACTIC.compile(spec, config, CPU)(inputs)[0], want)


@pytest.mark.parametrize("c, k, stride, pads", [(3, 3, 2, (1, 1, 1, 1)), (1, 3, 1, (0, 1, 2, 0)),
                                                (4, 3, 2, (0, 0, 1, 1)), (1, 5, 2, (2, 2, 2, 2))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_direct_matches_reference(c, k, stride, pads, channels_last):
    """A 3x3/2 stem on 3 channels, one and four channels, a 5x5 kernel, asymmetric pads; 20 output channels cut the
    16-channel tiles."""
    g = torch.Generator().manual_seed(c * 10 + k)
    x = torch.randn(2, c, 11, 9, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    inputs = [x, torch.randn(20, c, k, k, generator=g), torch.randn(20, generator=g)]
    spec, want = _spec("Conv", {**_attrs(1, k, stride, pads)}, inputs)
    assert DIRECT.supports(spec, CPU) is None
    _check(DIRECT.compile(spec, SMALL_DIRECT, CPU)(inputs)[0], want)


@pytest.mark.parametrize("c, k, stride, pads", [(3, 3, 2, (1, 1, 1, 1)), (1, 3, 1, (0, 1, 2, 0)),
                                                (4, 3, 2, (0, 0, 1, 1)), (1, 5, 2, (2, 2, 2, 2))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_direct_dot_matches_reference(c, k, stride, pads, channels_last):
    """The tensor-core gather (DOT): every tap of a tile's pixels in one [pixels, C·KH·KW] tile, K padded to 16 or 32
    once, fp16; 20 output channels cut the 16-channel tiles."""
    g = torch.Generator().manual_seed(c * 10 + k)
    x = torch.randn(2, c, 11, 9, generator=g).half()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    inputs = [x, (torch.randn(20, c, k, k, generator=g) * 0.5).half(), torch.randn(20, generator=g).half()]
    spec, want = _spec("Conv", {**_attrs(1, k, stride, pads)}, inputs)
    _check(DIRECT.compile(spec, dict(SMALL_DIRECT, DOT=1), CPU)(inputs)[0], want)


def test_direct_dot_configs_only_for_two_byte_inputs():
    """fp16 layers get DOT tiles first, fp32 ones none; a DOT tile refuses fp32 inputs."""
    x, w = torch.randn(1, 3, 16, 16), torch.randn(32, 3, 3, 3)
    spec16, _ = _spec("Conv", _attrs(1, 3, 2), [x.half(), w.half()])
    spec32, _ = _spec("Conv", _attrs(1, 3, 2), [x, w])
    assert DIRECT.configs(spec16, CPU, 3)[0]["DOT"] and not any(c["DOT"] for c in DIRECT.configs(spec32, CPU, 4))
    with pytest.raises(ValueError, match="fp16"):
        direct_conv.direct_conv2d(x, conv.pack_weight(w), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1),
                                  config=dict(SMALL_DIRECT, DOT=1))


def test_large_fp16_direct_convs_get_dot_tiles_alone_below_level_4():
    """At FEW_ROWS output pixels or more (MobileNetV2's stem at batch 64) the outer products are left out below level
    4 and half as many DOT tiles offered; fewer pixels (batch 1) and fp32 keep the outer products."""
    big, small = direct_conv.FEW_ROWS, direct_conv.FEW_ROWS - 1
    large = direct_conv.configs(big, 32, 3, dot=True)
    assert large and all(c["DOT"] for c in large) and len(large) == direct_conv.PER_LEVEL[3] // 2
    assert {c["DOT"] for c in direct_conv.configs(small, 32, 3, dot=True)} == {0, 1}
    assert {c["DOT"] for c in direct_conv.configs(big, 32, 4, dot=True)} == {0, 1}
    assert not any(c["DOT"] for c in direct_conv.configs(big, 32, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_direct_fused_relu6_with_residual(dtype):
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(1, 3, 8, 8, generator=g).to(dtype), torch.randn(1, 24, 4, 4, generator=g).to(dtype)
    w, b = (torch.randn(24, 3, 3, 3, generator=g) * 0.5).to(dtype), torch.randn(24, generator=g).to(dtype)
    attrs = _attrs(1, stride=2, residual=True, activation="Clip", activation_params=[0.0, 6.0])
    spec, want = _spec("FusedConv", attrs, [x, w, b, r])
    assert all(cfg["layout"] == "nhwc" for cfg in DIRECT.configs(spec, CPU, 4))
    _check(DIRECT.compile(spec, SMALL_DIRECT, CPU)([x, w, b, r])[0], want)


def test_direct_refuses_many_taps():
    with pytest.raises(ValueError, match="taps"):
        direct_conv.direct_conv2d(torch.randn(1, 8, 4, 4), conv.pack_weight(torch.randn(2, 8, 3, 3)), (3, 3), (1, 1),
                                  (1, 1, 1, 1), (1, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("c, hw, stride", [(32, 112, 1), (96, 112, 2), (144, 56, 1), (960, 7, 1)])
def test_gpu_mobilenet_shapes_every_config(c, hw, stride):
    """MobileNetV2's depthwise shapes at batch 8 in fp16, channels_last, ReLU6, every config offered at level 4."""
    x = torch.randn(8, c, hw, hw, device="cuda").half().contiguous(memory_format=torch.channels_last)
    w, b = (torch.randn(c, 1, 3, 3, device="cuda") * 0.3).half(), torch.randn(c, device="cuda").half()
    spec, want = _spec("FusedConv", _attrs(c, stride=stride, activation="Clip", activation_params=[0.0, 6.0],
                                           residual=False), [x, w, b])
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    for config in TACTIC.configs(spec, dev, 4):
        _check(TACTIC.compile(spec, config, dev)([x, w, b])[0], want)


@pytest.mark.gpu
@pytest.mark.parametrize("co, k", [(32, 3), (16, 5)])
def test_gpu_stems_every_config(co, k):
    """MobileNetV2's 3→32 3x3/2 stem (and a 1-channel 5x5/2) at batch 8 in fp16, every config at level 4."""
    c = 3 if k == 3 else 1
    x = torch.randn(8, c, 224, 224, device="cuda").half()
    w, b = (torch.randn(co, c, k, k, device="cuda") * 0.2).half(), torch.randn(co, device="cuda").half()
    p = k // 2
    spec, want = _spec("FusedConv", _attrs(1, k, 2, (p, p, p, p), activation="Relu", activation_params=[],
                                           residual=False), [x, w, b])
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    for config in DIRECT.configs(spec, dev, 4):
        _check(DIRECT.compile(spec, config, dev)([x, w, b])[0], want)
