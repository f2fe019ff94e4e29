"""kernels/int8_conv_halo.py and the triton_int8_conv_halo tactic: which convs and tiles it takes, that it compiles
for sm90 with the halo boxes fed to wgmma from shared memory (triton 3.6's Gluon), and, on a Hopper GPU, the pointer
conv's bits for every tile, ragged maps and residuals included."""

import pytest
import torch

from kiln.kernels import int8_conv, int8_conv_halo as halo
from kiln.tactics import registry
from kiln.tactics.triton_int8_wgmma import _halo_reason
from test_kernels_int8_wgmma import GPU_LIKE, _compile_sm90, _conv, _desc_sig, _needs_hopper

SMEM = 227 * 1024
needs_halo = pytest.mark.skipif(not halo.available(),
                                reason="needs triton 3.6's Gluon (views starting inside a shared-memory buffer)")


@pytest.mark.parametrize("c, co, hw", [(64, 64, 56), (128, 128, 28), (256, 256, 14), (48, 80, 13)])
def test_configs_fit_shared_memory_and_keep_channel_blocks_whole(c, co, hw):
    cfgs = halo.configs((3, 3), hw, hw, co, c, SMEM, False)
    assert cfgs
    for cfg in cfgs:
        need = halo.smem_bytes(cfg, (3, 3), c, False)
        assert need <= SMEM and c % cfg["BLOCK_K"] == 0 and cfg["num_warps"] == 4, cfg
        assert cfg["stream"] * (need + 1024) <= SMEM + 1024 and cfg["stream"] in (1, 2, 3, 4), cfg
        assert cfg["stream"] == 4 or (cfg["stream"] + 1) * (need + 1024) > SMEM + 1024, cfg
        assert halo.rows(cfg, (3, 3)) == cfg["STAGES"] * 3 * (cfg["BH"] + 2) * cfg["BW"]
        assert need > 9 * c * cfg["BLOCK_N"] + halo.rows(cfg, (3, 3)) * cfg["BLOCK_K"]  # weights + boxes + tiles


def test_halo_rows_round_the_kernel_rows_up_to_a_box_side():
    assert [halo.halo_rows(k) for k in (2, 3, 4, 5, 7)] == [1, 2, 4, 4, 8]
    cfg = {"BH": 8, "BW": 16, "STAGES": 2}
    assert halo.rows(cfg, (4, 1)) == 2 * 1 * (8 + 4) * 16  # the stem's 4x1 conv of S's rows


def test_configs_refuse_what_the_kernel_cannot_take():
    assert not halo.configs((1, 1), 56, 56, 64, 64, SMEM, False)  # no halo: a GEMM
    assert not halo.configs((3, 3), 56, 56, 64, 24, SMEM, False)  # 24 channels: not 16-byte rows
    assert not halo.configs((3, 3), 56, 56, 64, 64, 16 * 1024, False)  # nothing fits 16 KiB
    # a weight block larger than shared memory leaves only the narrow tiles
    assert all(c["BLOCK_N"] == 32 for c in halo.configs((3, 3), 7, 7, 512, 512, SMEM, False))


def test_halo_reason_takes_stride_1_convs_of_two_or_more_rows():
    g = torch.Generator().manual_seed(0)
    assert _halo_reason(_conv(g, k=3)[0]) is None
    assert _halo_reason(_conv(g, k=5)[0]) is None
    assert "two or more rows" in _halo_reason(_conv(g, k=1)[0])
    assert "stride 1" in _halo_reason(_conv(g, k=3, strides=(2, 2))[0])


def test_tactic_says_why_it_refuses_on_a_triton_without_inner_views():
    g = torch.Generator().manual_seed(1)
    reason = registry.get("triton_int8_conv_halo").supports(_conv(g, k=3)[0], GPU_LIKE)
    if halo.available():
        assert reason is None
        assert "multiples of 16" in registry.get("triton_int8_conv_halo").supports(_conv(g, k=3, c=24)[0], GPU_LIKE)
    else:
        assert "triton 3.6" in reason


@needs_halo
def test_halo_conv_compiles_for_hopper_with_the_boxes_fed_to_wgmma_from_shared_memory():
    """AOT for sm90: 4-D TMA boxes in, nine wgmmas per channel block left in flight while the next unit's boxes are
    requested, a TMA store out, no fused multiply-add."""
    for cfg in halo.configs((3, 3), 56, 56, 64, 64, SMEM, True)[:3]:
        bh, bw, bn, bk = cfg["BH"], cfg["BW"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        sig = {"x_desc": _desc_sig([1, bh, bw, bk]), "t_desc": _desc_sig([1, 2, bw, bk]), "w_desc": _desc_sig([bn, bk]),
               "y_desc": _desc_sig([1, bh, bw, bn]), "r_desc": _desc_sig([1, bh, bw, bn]), "scale": "*fp32",
               "bias": "*fp32", "out_inv": "fp32", "res_scale": "fp32"}
        sig |= dict.fromkeys("CO ph pw tiles_w tiles_hw tiles".split(), "i32")
        consts = {"HAS_BIAS": True, "HAS_RES": True, "ACT": "relu", "KH": 3, "KW": 3, "CB": 1,
                  "STAGES": cfg["STAGES"], "PDL": True}
        ptx = _compile_sm90(halo._halo_conv_kernel, sig, consts, 4).asm["ptx"]
        assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("griddepcontrol.wait"), cfg
        assert "cp.async.bulk.tensor.4d.shared::cluster.global" in ptx and "wgmma.wait_group.sync.aligned 9;" in ptx
        assert "cp.async.bulk.tensor.4d.global.shared" in ptx and "fma.rn.f32" not in ptx, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("res", [False, True])
def test_gpu_halo_conv_is_bit_exact(res):
    """Ragged maps (13x11, 9x20), one and two channel blocks, unequal pads, every tile: kernels/int8_conv.py's
    bits."""
    _needs_hopper()
    if not halo.available():
        pytest.skip("needs triton 3.6's Gluon (views starting inside a shared-memory buffer)")
    g = torch.Generator(device="cuda").manual_seed(2)
    for n, c, h, w, co, k, pads in [(3, 64, 13, 11, 48, 3, [1, 1, 1, 1]), (2, 128, 9, 20, 64, 3, [1, 0, 1, 2]),
                                    (2, 32, 12, 12, 32, 5, [2, 2, 2, 2])]:
        x = torch.randint(-127, 128, (n, c, h, w), device="cuda", dtype=torch.int8, generator=g)
        x = x.contiguous(memory_format=torch.channels_last)
        packed = int8_conv.pack_weight(torch.randint(-127, 128, (co, c, k, k), device="cuda", dtype=torch.int8,
                                                     generator=g))
        scale = torch.rand(co, device="cuda", generator=g) * 1e-4
        bias = torch.randn(co, device="cuda", generator=g)
        oh, ow = h + pads[0] + pads[2] - k + 1, w + pads[1] + pads[3] - k + 1
        kw = dict(out_scale=0.05, activation="relu")
        if res:
            r = torch.randint(-127, 128, (n, co, oh, ow), device="cuda", dtype=torch.int8, generator=g)
            kw |= dict(residual=r.contiguous(memory_format=torch.channels_last), res_scale=0.01)
        want = int8_conv.conv2d(x, packed, scale, (k, k), (1, 1), pads, (1, 1), bias, **kw)
        cfgs = halo.configs((k, k), oh, ow, co, c, SMEM, res)
        assert cfgs
        for cfg in cfgs:
            got = halo.conv2d(x, packed, scale, (k, k), pads, bias, config=cfg, **kw)
            assert torch.equal(got, want), (n, c, h, w, co, k, cfg)


@pytest.mark.gpu
def test_gpu_s2d_halo_stem_is_bit_exact():
    """ResNet's 7x7 / stride-2 stem on a ragged 3-channel image through triton_int8_conv_s2d_halo (space-to-depth,
    then the halo conv's 4x1 conv over S's overlapping rows by TMA): the pointer stem's bits."""
    from kiln.target.device import detect
    from kiln.tactics import registry
    from test_kernels_int8 import EPI, _i8, _spec
    _needs_hopper()
    if not halo.available():
        pytest.skip("needs triton 3.6's Gluon (views starting inside a shared-memory buffer)")
    g = torch.Generator().manual_seed(5)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [7, 7], "pads": [3] * 4,
             "strides": [2, 2], "x_scale": 0.1, "out_scale": 0.5} | EPI | {"activation": "Relu"}
    inputs = [_i8(g, 3, 3, 37, 45), _i8(g, 64, 3, 7, 7), torch.rand(64, generator=g) * 1e-3 + 1e-4,
              torch.randn(64, generator=g)]
    spec, args, _ = _spec("QuantConv", attrs, inputs, device="cuda")
    gpu = detect("cuda")
    want = registry.get("triton_int8_conv_s2d").compile(spec, {"layout": "nhwc", **registry.get(
        "triton_int8_conv_s2d").configs(spec, gpu, 2)[0]}, gpu)(args)[0]
    t = registry.get("triton_int8_conv_s2d_halo")
    assert t.supports(spec, gpu) is None
    for cfg in t.configs(spec, gpu, 3):
        assert torch.equal(t.compile(spec, cfg, gpu)(args)[0], want), cfg


def test_halo_configs_take_the_widest_channel_block_that_fits():
    """128-byte box rows where the channels divide and shared memory holds them, 64-byte ones otherwise."""
    for c, hw in [(128, 28), (256, 14)]:
        cfgs = halo.configs((3, 3), hw, hw, c, c, SMEM, False)
        assert any(cfg["BLOCK_K"] == 128 for cfg in cfgs) and any(cfg["BLOCK_K"] == 64 for cfg in cfgs), c
        for cfg in cfgs:
            assert halo.smem_bytes(cfg, (3, 3), c, False) <= SMEM
            if cfg["BLOCK_K"] == 64:  # only where the 128-wide block does not fit
                assert halo.smem_bytes(cfg | {"BLOCK_K": 128}, (3, 3), c, False) > SMEM, cfg
    assert {cfg["BLOCK_K"] for cfg in halo.configs((3, 3), 56, 56, 64, 64, SMEM, False)} == {64}


def test_the_measured_layer_3_winner_is_among_the_configs_the_autotuner_times():
    """ResNet-50's layer-3 3x3 conv (256 channels, 14x14) was fastest as 8x8x64 on 128-byte blocks with two stages
    (H100, 2026-11-24): it must be among the configs the autotuner times."""
    from kiln.builder.autotune import CONFIGS_PER_TACTIC
    cfgs = halo.configs((3, 3), 14, 14, 256, 256, SMEM, False)[:CONFIGS_PER_TACTIC[3]]
    assert any((c["BH"], c["BW"], c["BLOCK_N"], c["BLOCK_K"], c["STAGES"]) == (8, 8, 64, 128, 2) for c in cfgs)
