"""kernels/int8_gemm_wgmma.py (Gluon) and the triton_int8_gemm_wgmma / triton_int8_conv_wgmma tactics: what they
take and refuse, that they compile for sm90 with one wgmma left in flight inside the loop (`wgmma.wait_group 1`,
which Triton's own pipeliner never emits for int32 accumulators) and the conv's input boxes fed to wgmma from
shared memory, and, on a Hopper GPU, the reference's bits."""

import pytest
import torch

from kiln.target.device import Device
from kiln.kernels import int8_gemm, int8_gemm_wgmma
from kiln.tactics import registry
from test_kernels_int8 import EPI, _i8, _spec

GPU_LIKE = Device("cuda", "test", "cuda")  # supports() reads the backend and capability; nothing touches a GPU
needs_gluon = pytest.mark.skipif(not int8_gemm_wgmma.available(), reason="this triton has no Gluon")


def _needs_hopper():
    """Skips a GPU test without a Hopper GPU (wgmma, TMA) or without Gluon."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (wgmma, TMA)")
    if not int8_gemm_wgmma.available():
        pytest.skip("this triton has no Gluon")


def _conv(g, k=1, strides=(1, 1), act="Relu", res_scale=0.02, c=32, co=48):
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [k, k], "pads": [k // 2] * 4,
             "strides": list(strides), "x_scale": 0.1, "out_scale": 0.5, "res_scale": res_scale} | EPI | {
        "activation": act}
    x = _i8(g, 2, c, 6, 6).contiguous(memory_format=torch.channels_last)
    inputs = [x, _i8(g, co, c, k, k), torch.rand(co, generator=g) * 1e-3 + 1e-4, torch.randn(co, generator=g)]
    oh = (6 + 2 * (k // 2) - k) // strides[0] + 1
    if res_scale is not None:
        inputs.append(_i8(g, 2, co, oh, oh).contiguous(memory_format=torch.channels_last))
    return _spec("QuantConv", attrs, inputs)


@needs_gluon
def test_wgmma_tactic_takes_1x1_relu_int8_convs_and_refuses_the_rest():
    g = torch.Generator().manual_seed(0)
    t = registry.get("triton_int8_gemm_wgmma")
    assert t.supports(_conv(g)[0], GPU_LIKE) is None
    assert t.supports(_conv(g, res_scale=None)[0], GPU_LIKE) is None
    assert "1x1" in t.supports(_conv(g, k=3)[0], GPU_LIKE)
    assert "1x1" in t.supports(_conv(g, strides=(2, 2))[0], GPU_LIKE)
    assert "activations" in t.supports(_conv(g, act="Sigmoid")[0], GPU_LIKE)
    assert t.supports(_conv(g, act="Gelu")[0], GPU_LIKE) is None
    assert "multiples of 16" in t.supports(_conv(g, c=24)[0], GPU_LIKE)
    configs = t.configs(_conv(g)[0], GPU_LIKE, 3)
    assert configs and all(c["layout"] == "nhwc" for c in configs)


@needs_gluon
def test_wgmma_conv_tactic_takes_convs_of_16_channel_multiples_and_strided_ones_the_phase_view_can_read():
    g = torch.Generator().manual_seed(1)
    t = registry.get("triton_int8_conv_wgmma")
    assert t.supports(_conv(g, k=3)[0], GPU_LIKE) is None and t.supports(_conv(g, k=1)[0], GPU_LIKE) is None
    assert "64 channels" in t.supports(_conv(g, k=3, strides=(2, 2))[0], GPU_LIKE)  # 32 channels
    strided = _conv(g, k=3, strides=(2, 2), c=128)[0]  # a 6x6 map: sides even
    assert t.supports(strided, GPU_LIKE) is None
    assert {c["BLOCK_K"] for c in t.configs(strided, GPU_LIKE, 3)} <= {64, 128}
    assert "multiples of the strides" in t.supports(_conv(g, k=3, strides=(4, 4), c=128)[0], GPU_LIKE)
    assert t.supports(_conv(g, k=1, strides=(2, 2))[0], GPU_LIKE) is None  # a subsample's stride-1 conv
    assert "multiple of 16" in t.supports(_conv(g, k=3, c=24)[0], GPU_LIKE)
    assert "int8 residuals" in t.supports(_float_res(g), GPU_LIKE)
    assert all(c["layout"] == "nhwc" for c in t.configs(_conv(g, k=3)[0], GPU_LIKE, 3))


def _float_res(g):
    """A 3x3 conv whose residual is fp32 (no res_scale): the wgmma tactics take int8 residuals only."""
    spec, _, _ = _conv(g, k=3, res_scale=None)
    from kiln.ir import DType
    from kiln.tactics.spec import ValueSpec
    out = spec.outputs[0]
    return type(spec)(spec.name, spec.kind, spec.attrs, spec.inputs + (ValueSpec(DType.FLOAT32, out.shape),),
                      spec.outputs)


def _desc_sig(block):
    from triton.experimental.gluon import language as gl
    return f"tensordesc<i8[{','.join(map(str, block))}],{gl.NVMMASharedLayout.get_default_for(block, gl.int8)!r}>"


def _compile_sm90(kernel, sig, consts, num_warps):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    return triton.compile(GluonASTSource(kernel, sig | dict.fromkeys(consts, "constexpr"), consts),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "enable_fp_fusion": False})


@needs_gluon
@pytest.mark.parametrize("stride", [1, 2])
def test_wgmma_conv_compiles_for_hopper_feeding_wgmma_from_shared_memory(stride):
    """The 5-D input box (BI images of the stride phase view) is reshaped in shared memory (no trip through
    registers, unlike kernels/int8_conv_tma.py), and one wgmma stays in flight; every tile, strided or not."""
    cfgs = int8_gemm_wgmma.conv_configs(7, 7, 512, 512, 227 * 1024) + int8_gemm_wgmma.conv_configs(
        14, 14, 256, 256, 227 * 1024)
    assert any(c["BI"] == 2 for c in cfgs) and any(c["BH"] == 16 for c in cfgs)
    for cfg in cfgs:
        bi, bh, bw, bn, bk = cfg["BI"], cfg["BH"], cfg["BW"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        sig = {"x_desc": _desc_sig([bi, bh, 1, bw, bk]), "w_desc": _desc_sig([bn, bk]), "scale": "*fp32",
               "bias": "*fp32", "res": "*i8", "y": "*i8", "out_inv": "fp32", "res_scale": "fp32"}
        sig |= dict.fromkeys("N OH OW CO C KW ph pw dh dw s_rn s_rh s_rw s_yn s_yh s_yw NUM_K".split(), "i32")
        k = _compile_sm90(int8_gemm_wgmma._wgmma_conv_kernel, sig, {"HAS_BIAS": True, "HAS_RES": True, "ACT": "relu",
                                                                     "STAGES": cfg["STAGES"], "SH": stride,
                                                                     "SW": stride, "PDL": True}, cfg["num_warps"])
        ptx = k.asm["ptx"]
        assert "cp.async.bulk.tensor.5d" in ptx and "wgmma.wait_group.sync.aligned 1;" in ptx, cfg
        assert "griddepcontrol.wait" in ptx, cfg
        assert "local_load" not in k.asm["ttgir"], cfg


def test_phase_view_puts_each_stride_phase_in_one_box():
    """Input row 2i + a, column 2j + b of the phase view is element (i, a, j, b·C + c)."""
    x = torch.arange(2 * 6 * 4 * 3).reshape(2, 6, 4, 3)
    v = int8_gemm_wgmma.phase_view(x, 2, 2)
    assert v.shape == (2, 3, 2, 2, 6)
    for a in (0, 1):
        for b in (0, 1):
            assert torch.equal(v[:, :, a, :, b * 3:(b + 1) * 3], x[:, a::2, b::2])
    assert torch.equal(int8_gemm_wgmma.phase_view(x, 1, 1)[:, :, 0], x)


@needs_gluon
@pytest.mark.parametrize("res", [False, True])
def test_wgmma_gemm_compiles_for_hopper_with_one_wgmma_in_flight(res):
    """AOT compile for sm90 (no GPU needed): the loop waits for all but one wgmma (`wait_group 1`)."""
    for cfg in int8_gemm_wgmma.configs(4096, 256, 64, 227 * 1024):  # every tile, two-stage ones too
        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        sig = {"a_desc": _desc_sig([bm, bk]), "w_desc": _desc_sig([bn, bk]), "c_desc": _desc_sig([bm, bn]),
               "res": "*i8", "s_rm": "i32", "scale": "*fp32", "bias": "*fp32", "M": "i32", "N": "i32", "K": "i32",
               "out_inv": "fp32", "res_scale": "fp32"}
        consts = {"HAS_BIAS": True, "HAS_RES": res, "ACT": "gelu_erf" if res else "relu", "STAGES": cfg["STAGES"],
                  "PDL": res}
        k = _compile_sm90(int8_gemm_wgmma._wgmma_gemm_kernel, sig, consts, cfg["num_warps"])
        ptx = k.asm["ptx"]
        assert "wgmma.mma_async" in ptx and "wgmma.wait_group.sync.aligned 1;" in ptx, cfg
        # the epilogue rounds products and sums apart, as the reference; erf's own fused multiply-adds (GELU) are
        # the same in every kernel (kernels/common.erf)
        assert ("fma.rn.f32" in ptx) == res, cfg
        assert ("griddepcontrol.wait" in ptx) == res, cfg  # programmatic dependent launch only when asked


def test_wgmma_configs_fit_shared_memory():
    short = int8_gemm_wgmma.configs(200704, 256, 64, 227 * 1024)
    assert short[0]["STAGES"] == 2  # one-block reductions: two-stage tiles first
    assert all(c["STAGES"] > 2 for c in int8_gemm_wgmma.configs(8192, 768, 3072, 227 * 1024))
    for cfg in short:
        need = cfg["STAGES"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] + cfg["BLOCK_M"] * cfg["BLOCK_N"]
        assert need <= 227 * 1024
    assert all(c["BLOCK_N"] <= 64 for c in int8_gemm_wgmma.configs(200704, 64, 256, 227 * 1024)[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("res,act", [(False, "relu"), (True, "relu"), (False, "gelu_erf"), (False, "none")])
def test_gpu_wgmma_gemm_is_bit_exact(res, act):
    """Every tile, ragged M / N / K edges, with and without an int8 residual: the pointer GEMM's bits."""
    _needs_hopper()
    g = torch.Generator(device="cuda").manual_seed(1)
    m, n, k = 1000, 208, 336
    a = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
    scale = torch.rand(n, device="cuda", generator=g) * 1e-4
    bias = torch.randn(n, device="cuda", generator=g)
    kw = dict(out_scale=0.05, activation=act)
    if res:
        kw |= dict(residual=torch.randint(-127, 128, (m, n), device="cuda", dtype=torch.int8, generator=g),
                   res_scale=0.01)
    want = int8_gemm.matmul(a, w.t(), scale, bias, **kw)
    for cfg in int8_gemm_wgmma.configs(m, n, k, 227 * 1024):
        assert torch.equal(int8_gemm_wgmma.matmul(a, w, scale, bias, config=cfg, **kw), want), cfg


@pytest.mark.gpu
@pytest.mark.parametrize("res", [False, True])
def test_gpu_wgmma_conv_is_bit_exact(res):
    """3x3 / pad 1 and 1x1 convs on ragged 13x11 maps, every tile: kernels/int8_conv.py's bits."""
    from kiln.kernels import int8_conv
    _needs_hopper()
    g = torch.Generator(device="cuda").manual_seed(2)
    for k in (3, 1):
        x = torch.randint(-127, 128, (3, 48, 13, 11), device="cuda", dtype=torch.int8, generator=g)
        x = x.contiguous(memory_format=torch.channels_last)
        w = int8_conv.pack_weight(torch.randint(-127, 128, (80, 48, k, k), device="cuda", dtype=torch.int8,
                                                generator=g))
        scale = torch.rand(80, device="cuda", generator=g) * 1e-4
        bias = torch.randn(80, device="cuda", generator=g)
        pads = [k // 2] * 4
        kw = dict(out_scale=0.05, activation="relu")
        if res:
            r = torch.randint(-127, 128, (3, 80, 13, 11), device="cuda", dtype=torch.int8, generator=g)
            kw |= dict(residual=r.contiguous(memory_format=torch.channels_last), res_scale=0.01)
        want = int8_conv.conv2d(x, w, scale, (k, k), (1, 1), pads, (1, 1), bias, **kw)
        for cfg in int8_gemm_wgmma.conv_configs(13, 11, 80, 48, 227 * 1024):
            got = int8_gemm_wgmma.conv2d(x, w, scale, (k, k), pads, (1, 1), bias, config=cfg, **kw)
            assert torch.equal(got, want), (k, cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("res", [False, True])
def test_gpu_wgmma_conv_is_bit_exact_on_small_maps_and_at_stride_two(res):
    """3x3 / pad 1 and 2x2 / pad 0 stride-2 convs through the phase view, and a stride-1 3x3 conv of a 7x6 map
    (boxes of two images of an odd batch), outputs ragged against the tiles, 144 output channels, every tile that
    takes them: kernels/int8_conv.py's bits."""
    from kiln.kernels import int8_conv
    _needs_hopper()
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randint(-127, 128, (3, 128, 14, 12), device="cuda", dtype=torch.int8, generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    for k, pad, st in ((3, 1, 2), (2, 0, 2), (3, 1, 1)):
        xs = x if st == 2 else x[:, :, :7, :6]
        w = int8_conv.pack_weight(torch.randint(-127, 128, (144, 128, k, k), device="cuda", dtype=torch.int8,
                                                generator=g))
        scale = torch.rand(144, device="cuda", generator=g) * 1e-4
        bias = torch.randn(144, device="cuda", generator=g)
        kw = dict(out_scale=0.05, activation="relu")
        oh, ow = (xs.shape[2] + 2 * pad - k) // st + 1, (xs.shape[3] + 2 * pad - k) // st + 1
        assert (oh, ow) == (7, 6)
        if res:
            r = torch.randint(-127, 128, (3, 144, oh, ow), device="cuda", dtype=torch.int8, generator=g)
            kw |= dict(residual=r.contiguous(memory_format=torch.channels_last), res_scale=0.01)
        want = int8_conv.conv2d(xs, w, scale, (k, k), (st, st), [pad] * 4, (1, 1), bias, **kw)
        cfgs = [c for c in int8_gemm_wgmma.conv_configs(oh, ow, 144, 128, 227 * 1024) if 128 % c["BLOCK_K"] == 0]
        assert len(cfgs) >= 4 and any(c["BI"] == 2 for c in cfgs)  # two images a box: 3 is odd
        for cfg in cfgs:
            got = int8_gemm_wgmma.conv2d(xs, w, scale, (k, k), [pad] * 4, (1, 1), bias, config=cfg,
                                         strides=(st, st), **kw)
            assert torch.equal(got, want), (k, st, cfg)


@pytest.mark.gpu
def test_gpu_wgmma_conv_tactic_runs_strided_1x1_convs_on_the_subsample_view():
    """ResNet's stride-2 downsample shape (small): the tactic reads x[:, :, ::2, ::2] in place by TMA, every tile
    giving the reference's bits, on even and odd maps."""
    _needs_hopper()
    dev = Device("cuda", "cuda", "cuda:0")
    t = registry.get("triton_int8_conv_wgmma")
    g = torch.Generator().manual_seed(3)
    for size in (14, 13):
        attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
                 "strides": [2, 2], "x_scale": 0.1, "out_scale": 0.5, "res_scale": 0.02} | EPI | {"activation": "Relu"}
        oh = (size - 1) // 2 + 1
        inputs = [_i8(g, 3, 64, size, size).contiguous(memory_format=torch.channels_last), _i8(g, 128, 64, 1, 1),
                  torch.rand(128, generator=g) * 1e-3 + 1e-4, torch.randn(128, generator=g),
                  _i8(g, 3, 128, oh, oh).contiguous(memory_format=torch.channels_last)]
        spec, inputs, want = _spec("QuantConv", attrs, inputs, "cuda")
        assert t.supports(spec, dev) is None
        for cfg in t.configs(spec, dev, 3):
            assert torch.equal(t.compile(spec, cfg, dev)(inputs)[0], want), (size, cfg)



def test_stream_configs_keep_the_reduction_whole_in_shared_memory():
    for n, k, res in [(256, 64, True), (1024, 256, True), (2048, 512, False), (64, 256, False)]:
        cfgs = int8_gemm_wgmma.stream_configs(n, k, 227 * 1024, res)
        assert cfgs and all(k % c["BLOCK_K"] == 0 and c["BLOCK_K"] <= 128 for c in cfgs), (n, k)
        assert {c["STAGES"] for c in cfgs} == {2, 4}, (n, k)
        for c in cfgs:
            need = c["STAGES"] * c["BLOCK_M"] * k + c["BLOCK_N"] * k + \
                (2 + c["STAGES"] * res) * c["BLOCK_M"] * c["BLOCK_N"]
            assert need == int8_gemm_wgmma.stream_smem(c["BLOCK_M"], c["BLOCK_N"], k, c["STAGES"], res)
            assert c["stream"] * need <= 227 * 1024
    first = int8_gemm_wgmma.stream_configs(1024, 256, 227 * 1024, True)[0]  # ResNet-50 layer 3's last conv
    assert (first["BLOCK_M"], first["BLOCK_N"], first["stream"]) == (64, 64, 3)
    assert max(c["stream"] for c in int8_gemm_wgmma.stream_configs(1024, 256, 227 * 1024, True)[1:]) == 2
    assert not int8_gemm_wgmma.stream_configs(256, 1024, 227 * 1024, True)  # too long: the pipelined kernel's
    assert not int8_gemm_wgmma.stream_configs(256, 80, 227 * 1024, True)  # not whole 32-wide wgmma steps
    assert all(c["BLOCK_N"] <= 64 for c in int8_gemm_wgmma.stream_configs(64, 256, 227 * 1024, False))


@needs_gluon
def test_wgmma_tactic_tries_the_streaming_kernel_first_for_short_reductions():
    g = torch.Generator().manual_seed(3)
    configs = registry.get("triton_int8_gemm_wgmma").configs(_conv(g, c=64, co=256)[0], GPU_LIKE, 3)
    assert configs[0].get("stream") and any("STAGES" in c for c in configs)


@needs_gluon
@pytest.mark.parametrize("res", [False, True])
def test_wgmma_stream_kernel_compiles_for_hopper_overlapping_loads_and_stores(res):
    """AOT for sm90: TMA loads and stores around the wgmmas, the weight block loaded once, no fused multiply-add."""
    for n, k in [(256, 64), (1024, 256)]:
        cfgs = int8_gemm_wgmma.stream_configs(n, k, 227 * 1024, res)
        for cfg in cfgs[:1] + [c for c in cfgs if c["STAGES"] == 4][:1]:
            bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
            sig = {"a_desc": _desc_sig([bm, bk]), "w_desc": _desc_sig([bn, bk]), "c_desc": _desc_sig([bm, bn]),
                   "r_desc": _desc_sig([bm, bn]), "scale": "*fp32", "bias": "*fp32", "M": "i32", "N": "i32",
                   "out_inv": "fp32", "res_scale": "fp32"}
            consts = {"HAS_BIAS": True, "HAS_RES": res, "ACT": "relu", "KT": k // bk, "STAGES": cfg["STAGES"],
                      "PDL": True}
            ptx = _compile_sm90(int8_gemm_wgmma._wgmma_stream_kernel, sig, consts, cfg["num_warps"]).asm["ptx"]
            assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor.2d.global.shared" in ptx, cfg
            assert "fma.rn.f32" not in ptx, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("res", [False, True])
def test_gpu_wgmma_stream_gemm_is_bit_exact(res):
    """The persistent streaming kernel, every tile, ragged M and N, one and two K boxes: the pointer GEMM's bits."""
    _needs_hopper()
    g = torch.Generator(device="cuda").manual_seed(4)
    for m, n, k in [(5000, 208, 64), (777, 336, 256), (300, 96, 512)]:
        a = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8, generator=g)
        w = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
        scale = torch.rand(n, device="cuda", generator=g) * 1e-4
        bias = torch.randn(n, device="cuda", generator=g)
        kw = dict(out_scale=0.05, activation="relu")
        if res:
            kw |= dict(residual=torch.randint(-127, 128, (m, n), device="cuda", dtype=torch.int8, generator=g),
                       res_scale=0.01)
        want = int8_gemm.matmul(a, w.t(), scale, bias, **kw)
        cfgs = int8_gemm_wgmma.stream_configs(n, k, 227 * 1024, res)
        assert cfgs
        for cfg in cfgs:
            assert torch.equal(int8_gemm_wgmma.matmul(a, w, scale, bias, config=cfg, **kw), want), (m, n, k, cfg)
