"""kernels/int8_conv_tma.py (4-D TMA boxes, zero fill as padding) equals kernels/int8_conv.py bit for bit: int8 and
fp8, with residuals, requantized or float out, maps the output blocks do not divide; under TRITON_INTERPRET=1
on the CPU (the interpreter's descriptors fill out-of-range boxes with zeros, as TMA does)."""

import pytest
import torch

from kiln.kernels import int8_conv, int8_conv_tma

CASES = [  # N, C, H, W, CO, kernel, pads, dilations, config index
    (2, 16, 6, 7, 24, (3, 3), (1, 1, 1, 1), (1, 1), 0),
    (1, 32, 9, 5, 64, (3, 3), (1, 1, 1, 1), (1, 1), 3),
    (1, 16, 5, 6, 16, (3, 3), (2, 2, 2, 2), (2, 2), 7),
    (2, 48, 4, 4, 8, (1, 1), (0, 0, 0, 0), (1, 1), 0),
]


def _operands(case, dtype):
    nb, c, h, w, co, kernel = case[:6]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-100, 100, (nb, c, h, w), generator=g).to(torch.float32)
    wt = torch.randint(-100, 100, (co, c, *kernel), generator=g).to(torch.float32)
    if dtype == torch.float8_e4m3fn:
        x, wt = x / 8, wt / 8
    x = x.to(dtype).contiguous(memory_format=torch.channels_last)
    scale = torch.rand(co, generator=g) * 1e-3
    bias = torch.randn(co, generator=g)
    return x, int8_conv.pack_weight(wt.to(dtype)), scale, bias


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("quantized_residual", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_tma_conv_equals_the_pointer_conv(case, dtype, quantized_residual):
    x, packed, scale, bias = _operands(case, dtype)
    kernel, pads, dil = case[5], list(case[6]), case[7]
    cfg = dict(zip(int8_conv_tma.CONFIG_KEYS, int8_conv_tma._SPACE[case[8]]))
    n, _, h, w = x.shape
    oh, ow = h + pads[0] + pads[2] - dil[0] * (kernel[0] - 1), w + pads[1] + pads[3] - dil[1] * (kernel[1] - 1)
    g = torch.Generator().manual_seed(1)
    if quantized_residual:
        res = torch.randint(-100, 100, (n, case[4], oh, ow), generator=g).to(dtype)
        kw = dict(residual=res.contiguous(memory_format=torch.channels_last), res_scale=0.01, out_scale=0.05)
    else:
        kw = dict(residual=torch.randn(n, case[4], oh, ow, generator=g), out_dtype=torch.float16)
    args = (x, packed, scale, kernel, (1, 1), pads, dil, bias)
    want = int8_conv.conv2d(*args, activation="relu", **kw)
    got = int8_conv_tma.conv2d(*args, activation="relu", config=cfg, **kw)
    assert got.dtype == want.dtype and got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got.float(), want.float())


def test_calls_tma_cannot_take_run_the_pointer_conv():
    x, packed, scale, bias = _operands((1, 16, 6, 6, 16, (3, 3)), torch.int8)
    cfg = int8_conv_tma.configs(6, 6, 16, 16, 227 * 1024)[0]
    for xin, strides in ((x.contiguous(), (1, 1)), (x, (2, 2))):  # NCHW memory; a strided conv
        want = int8_conv.conv2d(xin, packed, scale, (3, 3), strides, [1] * 4, (1, 1), bias, out_scale=0.05)
        got = int8_conv_tma.conv2d(xin, packed, scale, (3, 3), strides, [1] * 4, (1, 1), bias, out_scale=0.05,
                                   config=cfg)
        assert torch.equal(got, want)
    assert not int8_conv_tma.addressable(3, 49) and int8_conv_tma.addressable(16, 9)


def _tactic_case(g, c, strides=(1, 1), res_scale=None, k=3, size=6):
    from test_kernels_int8 import EPI, _i8, _spec
    x, w, pad = _i8(g, 2, c, size, size), _i8(g, 24, c, k, k), k // 2
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [k, k], "pads": [pad] * 4,
             "strides": list(strides), "x_scale": 0.1, "out_scale": 0.5, "res_scale": res_scale} | EPI
    inputs = [x.contiguous(memory_format=torch.channels_last), w, torch.rand(24, generator=g) * 1e-3 + 1e-4,
              torch.randn(24, generator=g)]
    if res_scale:
        oh = (size + 2 * pad - k) // strides[0] + 1
        inputs.append(_i8(g, 2, 24, oh, oh).contiguous(memory_format=torch.channels_last))
    return _spec("QuantConv", attrs | {"activation": "Relu"}, inputs)


@pytest.mark.parametrize("tactic", ["triton_int8_conv_tma"])
def test_conv_tma_tactic_is_bit_exact_and_nhwc(tactic):
    from test_kernels_int8 import CPU
    from kiln.tactics import registry
    g = torch.Generator().manual_seed(5)
    spec, inputs, want = _tactic_case(g, 16, res_scale=0.02)
    t = registry.get(tactic)
    assert t.supports(spec, CPU) is None
    configs = t.configs(spec, CPU, 2)
    assert configs and {c["layout"] for c in configs} == {"nhwc"}
    for cfg in configs[:3]:
        assert torch.equal(t.compile(spec, cfg, CPU)(inputs)[0], want)


@pytest.mark.parametrize("size", [6, 7])
def test_conv_tma_tactic_runs_a_strided_1x1_conv_as_its_subsample(size):
    """A stride-2 1x1 conv (ResNet's downsample) is the stride-1 conv of x[:, :, ::2, ::2], a strided view TMA reads
    in place: bit-exact with the reference, on even and odd maps, with a residual."""
    from test_kernels_int8 import CPU
    from kiln.tactics import int8_lowering, registry
    g = torch.Generator().manual_seed(8)
    spec, inputs, want = _tactic_case(g, 32, strides=(2, 2), res_scale=0.02, k=1, size=size)
    assert int8_lowering.subsample(spec) == (2, 2)
    t = registry.get("triton_int8_conv_tma")
    assert t.supports(spec, CPU) is None
    for cfg in t.configs(spec, CPU, 2)[:2]:
        assert torch.equal(t.compile(spec, cfg, CPU)(inputs)[0], want)


def test_conv_tma_tactic_refuses_what_tma_cannot_address():
    from test_kernels_int8 import CPU
    from kiln.tactics import registry
    g = torch.Generator().manual_seed(6)
    t = registry.get("triton_int8_conv_tma")
    assert "multiple of 16" in t.supports(_tactic_case(g, 3)[0], CPU)
    assert "stride 1" in t.supports(_tactic_case(g, 16, strides=(2, 2))[0], CPU)


@pytest.mark.gpu
def test_gpu_conv_tma_resnet_shape():
    """ResNet-50's first 3x3 conv (64 channels, 56x56) at batch 8 on the GPU, every config, within the
    autotuner's tolerance of the reference (TMA's zero fill is the padding)."""
    from test_kernels_int8 import EPI, _conv_case, _spec
    from kiln.builder.autotune import _close
    from kiln.target.device import Device
    from kiln.tactics import registry
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (TMA)")
    dev = Device("cuda", "cuda", "cuda:0")
    g = torch.Generator().manual_seed(0)
    inputs, _ = _conv_case(g, 8, 64, 56, 64, 3)
    inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": 0.3} | EPI | {"activation": "Relu"}
    spec, inputs, want = _spec("QuantConv", attrs, inputs, "cuda")
    t = registry.get("triton_int8_conv_tma")
    for cfg in t.configs(spec, dev, 3):
        assert _close([t.compile(spec, cfg, dev)(inputs)[0]], [want], False, True) is None, cfg


@pytest.mark.parametrize("early", [False, True])
def test_tma_gemm_residual_loaded_early_or_late_is_bit_exact(early):
    """kernels/int8_gemm_tma.py reads an int8 residual by pointers before the reduction or by TMA after it: the
    same bits as the pointer GEMM either way."""
    from kiln.kernels import int8_gemm, int8_gemm_tma
    g = torch.Generator().manual_seed(7)
    a, w = (torch.randint(-100, 100, s, generator=g, dtype=torch.int8) for s in ((40, 64), (48, 64)))
    res = torch.randint(-100, 100, (40, 48), generator=g, dtype=torch.int8)
    scale, bias = torch.rand(48, generator=g) * 1e-3, torch.randn(48, generator=g)
    kw = dict(residual=res, res_scale=0.01, out_scale=0.05, activation="relu")
    want = int8_gemm.matmul(a, w.t(), scale, bias, **kw)
    cfg = int8_gemm_tma.configs(40, 48, 64, 227 * 1024)[0]
    assert torch.equal(int8_gemm_tma.matmul(a, w, scale, bias, config=cfg, res_early=early, **kw), want)


def test_tma_gemm_short_reductions_try_two_stage_tiles_first():
    """The default opt level times the first two tiles: for K ≤ SHORT_K those are two-stage tiles (faster at
    ResNet-50's 64-channel 1x1 convs), for longer K the deeper pipelines."""
    from kiln.kernels import int8_gemm_tma
    short = [c for c in int8_gemm_tma.configs(200704, 256, 64, 227 * 1024) if not c.get("persistent")]
    long = int8_gemm_tma.configs(200704, 64, 512, 227 * 1024)
    assert [c["num_stages"] for c in short[:2]] == [2, 2] and any(c["num_stages"] > 2 for c in short)
    assert all(c["num_stages"] > 2 for c in long) and not any(c.get("persistent") for c in long)


@pytest.mark.parametrize("res", [False, True])
def test_persistent_tma_gemm_is_bit_exact_and_leads_for_memory_bound_shapes(res):
    """The persistent TMA GEMM (programs loop over tiles; 4 programs on the CPU, so each takes several) gives the
    pointer GEMM's bits, with and without an int8 residual; it is tried first where K ≤ PERSISTENT_K."""
    from kiln.kernels import int8_gemm, int8_gemm_tma
    g = torch.Generator().manual_seed(11)
    m, n, k = 300, 80, 64
    a, w = (torch.randint(-100, 100, s, generator=g, dtype=torch.int8) for s in ((m, k), (n, k)))
    scale, bias = torch.rand(n, generator=g) * 1e-3, torch.randn(n, generator=g)
    kw = dict(out_scale=0.05, activation="relu")
    if res:
        kw |= dict(residual=torch.randint(-100, 100, (m, n), generator=g, dtype=torch.int8), res_scale=0.01)
    want = int8_gemm.matmul(a, w.t(), scale, bias, **kw)
    cfgs = int8_gemm_tma.configs(m, n, k, 227 * 1024)
    assert cfgs[0].get("persistent")
    cfg = dict(cfgs[0], BLOCK_M=64, BLOCK_N=64)  # 5 × 2 tiles over 4 programs
    assert torch.equal(int8_gemm_tma.matmul(a, w, scale, bias, config=cfg, **kw), want)
