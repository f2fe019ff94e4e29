"""int8 tactics (torch_int_mm, triton_int8_gemm) for QuantGemm / QuantConv against the bit-exact references.

On the CPU torch._int_mm runs its CPU kernel (the CUDA shape rules are applied by padding anyway, so the
padding is tested here) and the Triton kernel runs under TRITON_INTERPRET=1 at tiny shapes. Both must equal
the reference exactly where the epilogue is plain arithmetic (none / Relu); with a transcendental activation
the fp32 output is within fp32 rounding and a requantized output within 1 LSB (the autotuner's tolerance).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.builder.autotune import _close, _random_input  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.ir import DType  # noqa: E402
from kiln.kernels import int8_gemm  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402

CPU = Device("cpu", "cpu", "cpu")
SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
TACTICS = ["torch_int_mm", "triton_int8_gemm", "triton_int8_gemm_tma"]
CONV_TACTICS = TACTICS + ["triton_int8_conv"]  # the implicit-GEMM conv runs QuantConv only
EPI = {"activation": "none", "activation_params": []}


def _i8(g, *shape):
    return torch.randint(-127, 128, shape, generator=g, dtype=torch.int8)


def _spec(kind, attrs, inputs, device="cpu"):
    """The spec (inputs 1.. constant) and the reference output."""
    inputs = [None if t is None else t.to(device) for t in inputs]
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape), t if 0 < i < 4 else None)
                 for i, t in enumerate(inputs))
    want = run_reference(kind, inputs, attrs)[0]
    return LayerSpec("q", kind, attrs, vals, (ValueSpec(DType.from_torch(want.dtype), tuple(want.shape)),)), \
        inputs, want


def _gemm_case(g, lead, k, n, bias=True):
    x, w = _i8(g, *lead, k), _i8(g, n, k)
    ws = torch.rand(n, generator=g) * 1e-3 + 1e-4
    return [x, w, ws, torch.randn(n, generator=g) if bias else None]


def _conv_case(g, n, c, hw, m, k, res=True):
    x, w = _i8(g, n, c, hw, hw), _i8(g, m, c, k, k)
    ws = torch.rand(m, generator=g) * 1e-3 + 1e-4
    return [x, w, ws, torch.randn(m, generator=g)], res


def _run(tactic, spec, inputs, device=CPU):
    t = registry.get(tactic)
    assert t.supports(spec, device) is None
    config = t.configs(spec, device, 1)[0] if tactic == "torch_int_mm" else SMALL
    return t.compile(spec, config, device)(inputs)[0]


@pytest.mark.parametrize("tactic", TACTICS)
@pytest.mark.parametrize("lead,k,n", [((5,), 40, 24), ((2, 3), 37, 13), ((33,), 64, 70)])
@pytest.mark.parametrize("out_scale", [None, 0.05])
def test_quant_gemm_exact(tactic, lead, k, n, out_scale):
    """M ≤ 16, K and N not multiples of 8, N-D rows; fp32 or requantized int8 out, Relu: bit-exact."""
    g = torch.Generator().manual_seed(k * n)
    attrs = {"x_scale": 0.02, "out_scale": out_scale, "activation": "Relu", "activation_params": []}
    spec, inputs, want = _spec("QuantGemm", attrs, _gemm_case(g, lead, k, n, bias=n != 13))
    got = _run(tactic, spec, inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


CONVS = [  # (kernel, strides, pads, dilations)
    (1, [1, 1], [0, 0, 0, 0], [1, 1]),
    (1, [2, 2], [0, 0, 0, 0], [1, 1]),
    (3, [1, 1], [1, 1, 1, 1], [1, 1]),
    (3, [2, 2], [0, 1, 1, 0], [2, 2]),
    (7, [2, 2], [3, 3, 3, 3], [1, 1]),
]


@pytest.mark.parametrize("tactic", CONV_TACTICS)
@pytest.mark.parametrize("kernel,strides,pads,dilations", CONVS)
def test_quant_conv_exact(tactic, kernel, strides, pads, dilations):
    """1x1 (strided) as a GEMM over NHWC, kxk through im2col: residual, bias, Relu, requantize: bit-exact."""
    g = torch.Generator().manual_seed(kernel * 10 + strides[0])
    inputs, _ = _conv_case(g, 2, 3, 9, 10, kernel)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": dilations, "kernel_shape": [kernel, kernel],
             "pads": pads, "strides": strides, "x_scale": 0.1, "out_scale": None} | EPI
    ref_out = run_reference("QuantConv", inputs, attrs)[0]
    inputs.append(torch.randn(ref_out.shape, generator=g))
    for out_scale, act in ((None, "none"), (0.5, "Relu")):
        a = attrs | {"out_scale": out_scale, "activation": act}
        spec, args, want = _spec("QuantConv", a, inputs)
        got = _run(tactic, spec, args)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want)


@pytest.mark.parametrize("tactic", CONV_TACTICS)
@pytest.mark.parametrize("kernel,strides,pads,dilations", [CONVS[0], CONVS[3]])
def test_quant_conv_int8_residual_exact(tactic, kernel, strides, pads, dilations):
    """An int8 residual with res_scale (a previous block's int8 output, NCHW or NHWC), bias, Relu; fp32 and
    requantized out: bit-exact."""
    g = torch.Generator().manual_seed(kernel + 50)
    inputs, _ = _conv_case(g, 2, 3, 9, 10, kernel)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": dilations, "kernel_shape": [kernel, kernel],
             "pads": pads, "strides": strides, "x_scale": 0.1, "out_scale": None, "res_scale": 0.0123} | EPI
    r = _i8(g, *run_reference("QuantConv", inputs, attrs | {"res_scale": None})[0].shape)
    for out_scale, act, res in ((None, "none", r), (0.5, "Relu", r.contiguous(memory_format=torch.channels_last))):
        spec, args, want = _spec("QuantConv", attrs | {"out_scale": out_scale, "activation": act}, inputs + [res])
        got = _run(tactic, spec, args)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want)


def test_quant_conv_residual_type_must_match_res_scale():
    """A tactic refuses, with its reason, an int8 residual without res_scale and a float one with it."""
    g = torch.Generator().manual_seed(6)
    inputs, _ = _conv_case(g, 1, 4, 5, 8, 1)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": None} | EPI
    int8_res, _, _ = _spec("QuantConv", attrs, inputs + [_i8(g, 1, 8, 5, 5)])
    float_res, _, _ = _spec("QuantConv", attrs | {"res_scale": 0.1}, inputs + [torch.randn(1, 8, 5, 5)])
    for tactic in CONV_TACTICS:
        assert "needs a res_scale" in registry.get(tactic).supports(int8_res, CPU)
        assert "res_scale is given" in registry.get(tactic).supports(float_res, CPU)


@pytest.mark.parametrize("tactic", CONV_TACTICS)
def test_quant_conv_channels_last_input_and_gelu(tactic):
    """An NHWC (channels_last) input, as a previous int8 conv leaves it; Gelu within the autotuner's tolerance."""
    g = torch.Generator().manual_seed(3)
    inputs, _ = _conv_case(g, 1, 16, 6, 8, 1)
    inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
             "strides": [1, 1], "x_scale": 0.05, "out_scale": None, "activation": "Gelu", "activation_params": []}
    for out_scale in (None, 0.01):
        spec, args, want = _spec("QuantConv", attrs | {"out_scale": out_scale}, inputs)
        assert _close([_run(tactic, spec, args)], [want], False, quantized=True) is None


def test_grouped_conv_and_non_int8_refused_with_reason():
    g = torch.Generator().manual_seed(4)
    x, w = _i8(g, 1, 4, 5, 5), _i8(g, 4, 1, 3, 3)
    attrs = {"group": 4, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": None} | EPI
    spec, _, _ = _spec("QuantConv", attrs, [x, w, torch.ones(4), None])
    for tactic in CONV_TACTICS:
        assert "grouped" in registry.get(tactic).supports(spec, CPU)
    cands, refused = registry.candidates(spec, Device("cuda", "cuda", "cuda:0"))
    assert [t.name for t in cands] == [registry.REFERENCE] and {n for n, _ in refused} >= set(CONV_TACTICS)


def test_kernel_configs_fit_smem_and_int8_mma_depth():
    for level in (1, 3):
        for cfg in int8_gemm.configs(4096, 1024, 1024, 48 * 1024, level):
            assert cfg["BLOCK_K"] >= int8_gemm.MIN_BLOCK_K
            assert cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] <= 48 * 1024
    assert len(int8_gemm.configs(4096, 1024, 1024, 228 * 1024, 3)) > 5


def test_autotuner_int8_inputs_and_tolerance():
    """Quantized layers are timed on int8 data spread over [-127, 127]; ±1 LSB of an int8 output passes,
    ±2 does not; a dequantized output within fp32 rounding passes, one 1e-3 off does not."""
    x = _random_input(ValueSpec(DType.INT8, (64, 64)), "cpu")
    assert x.dtype == torch.int8 and x.min() <= -120 and x.max() >= 120 and (x == 0).float().mean() < 0.05
    want = torch.randint(-127, 128, (100,), dtype=torch.int8)
    one = (want.int() + torch.randint(-1, 2, (100,), dtype=torch.int32)).clamp(-127, 127).to(torch.int8)
    assert _close([one], [want], False, quantized=True) is None
    two = want.clone()
    two[7] = two[7] + (2 if two[7] < 100 else -2)
    assert "wrong result" in _close([two], [want], False, quantized=True)
    assert "wrong result" in _close([one], [want], False)  # other int8 outputs stay exact
    assert _close([one], [want], False, requantized=True) is None  # an add+LayerNorm's quantized copy
    assert "wrong result" in _close([two], [want], False, requantized=True)
    y = torch.randn(100) * 50
    assert _close([y * (1 + 3e-7)], [y], False, quantized=True) is None
    assert "wrong result" in _close([y + 1e-2], [y], False, quantized=True)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", TACTICS)
def test_gpu_bert_and_resnet_shapes(tactic):
    """BERT FFN (M=8192, K=768, N=3072) and a ResNet 3x3 conv on the GPU, within the autotuner's tolerance."""
    dev = Device("cuda", "cuda", "cuda:0")
    g = torch.Generator().manual_seed(0)
    attrs = {"x_scale": 0.02, "out_scale": 0.05, "activation": "Gelu", "activation_params": []}
    spec, inputs, want = _spec("QuantGemm", attrs, _gemm_case(g, (64, 128), 768, 3072), "cuda")
    t = registry.get(tactic)
    assert _close([t.compile(spec, t.configs(spec, dev, 1)[0], dev)(inputs)[0]], [want], False, True) is None
    inputs, _ = _conv_case(g, 8, 64, 56, 64, 3)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": 0.3, "activation": "Relu", "activation_params": []}
    spec, inputs, want = _spec("QuantConv", attrs, inputs, "cuda")
    assert _close([t.compile(spec, t.configs(spec, dev, 1)[0], dev)(inputs)[0]], [want], False, True) is None


@pytest.mark.parametrize("tactic", TACTICS)
def test_fp16_output_within_one_fp16_rounding(tactic):
    """out_dtype fp16 (the reader is fp16): the reference's fp32 value rounded once; the tactic within 1 fp16 ulp."""
    g = torch.Generator().manual_seed(11)
    attrs = {"x_scale": 0.02, "out_scale": None, "activation": "Relu", "activation_params": [],
             "out_dtype": DType.FLOAT16}
    spec, inputs, want = _spec("QuantGemm", attrs, _gemm_case(g, (33,), 64, 24))
    fp32 = run_reference("QuantGemm", inputs, attrs | {"out_dtype": None})[0]
    assert want.dtype == torch.float16 and torch.equal(want, fp32.half())
    got = _run(tactic, spec, inputs)
    assert got.dtype == torch.float16 and _close([got], [want], False, quantized=True) is None


def test_triton_quantize_matches_reference_ties_and_saturation():
    """fp32 and fp16 inputs (fp16 read as fp32, as behind the cast it replaces): halves round to even,
    values beyond the range saturate to -128 / 127, exactly as the reference."""
    from kiln.kernels import quantize

    scale = 0.5
    ties = torch.tensor([0.25, 0.75, -0.25, -0.75, 1.25, 63.75, -64.25, 100.0, -100.0, 0.0])  # /0.5: x.5 values
    x = torch.cat([ties, torch.randn(3000, generator=torch.Generator().manual_seed(0)) * 40])
    attrs = {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": DType.INT8, "precision": DType.FLOAT32}
    nhwc = x[:3000].reshape(1, 6, 20, 25).contiguous(memory_format=torch.channels_last)
    for t in (x, x.half(), nhwc):
        want = run_reference("QuantizeLinear", [t, torch.tensor(scale)], attrs)[0]
        got = quantize.quantize(t, scale, quantize.CONFIGS[2])
        assert got.dtype == torch.int8 and torch.equal(got, want)
    assert quantize.quantize(nhwc, scale).is_contiguous(memory_format=torch.channels_last)  # kept NHWC
    assert quantize.quantize(ties, scale)[:4].tolist() == [0, 2, 0, -2] and quantize.quantize(ties, scale)[7] == 127


def test_triton_quantize_supports_only_per_tensor_int8():
    cuda = Device("cuda", "cuda", "cuda:0")
    t = registry.get("triton_quantize")
    base = {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": DType.INT8, "precision": None}
    x, s = ValueSpec(DType.FLOAT16, (4, 8)), ValueSpec(DType.FLOAT32, (), torch.tensor(0.1))
    out = (ValueSpec(DType.INT8, (4, 8)),)
    assert t.supports(LayerSpec("q", "QuantizeLinear", base, (x, s), out), cuda) is None
    per_axis = ValueSpec(DType.FLOAT32, (8,), torch.ones(8))
    assert t.supports(LayerSpec("q", "QuantizeLinear", base, (x, per_axis), out), cuda)
    assert t.supports(LayerSpec("q", "QuantizeLinear", base | {"output_dtype": DType.UINT8}, (x, s), out), cuda)
    zp = ValueSpec(DType.INT8, (), torch.tensor(3, dtype=torch.int8))
    assert t.supports(LayerSpec("q", "QuantizeLinear", base, (x, s, zp), out), cuda)


@pytest.mark.parametrize("c,out", [(40, None), (3, 0.25)])
def test_int8_conv_channel_blocks_and_fp16_out(c, out):
    """Channels over several BLOCK_K blocks (40 = 32 + 8) and fewer than one (3): flat tap × channel-block loop;
    a float output in fp16 within one rounding of the reference's fp32."""
    g = torch.Generator().manual_seed(c)
    inputs, _ = _conv_case(g, 2, c, 7, 12, 3)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1, 0, 1, 2],
             "strides": [2, 1], "x_scale": 0.05, "out_scale": out, "activation": "Relu", "activation_params": [],
             "out_dtype": DType.FLOAT16 if out is None else None}
    spec, args, want = _spec("QuantConv", attrs, inputs)
    got = _run("triton_int8_conv", spec, args)
    assert got.is_contiguous(memory_format=torch.channels_last) and got.dtype == want.dtype
    assert _close([got], [want], False, quantized=True) is None


@pytest.mark.gpu
def test_gpu_int8_conv_resnet_shape():
    dev = Device("cuda", "cuda", "cuda:0")
    g = torch.Generator().manual_seed(0)
    inputs, _ = _conv_case(g, 8, 64, 56, 64, 3)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": 0.3, "activation": "Relu", "activation_params": []}
    spec, inputs, want = _spec("QuantConv", attrs, inputs, "cuda")
    t = registry.get("triton_int8_conv")
    for cfg in t.configs(spec, dev, 3):
        assert _close([t.compile(spec, cfg, dev)(inputs)[0]], [want], False, True) is None


@pytest.mark.parametrize("tactic", ["triton_int8_gemm", "triton_int8_gemm_tma"])
def test_conv_gemm_configs_are_timed_on_nhwc_input(tactic):
    """A conv lowered to GEMM reads NHWC rows in place, so its configs say so (the autotuner then feeds it
    channels_last input); a QuantGemm's do not."""
    g = torch.Generator().manual_seed(3)
    inputs, _ = _conv_case(g, 2, 32, 6, 16, 1)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": 0.5} | EPI
    conv, _, _ = _spec("QuantConv", attrs, inputs)
    gemm, _, _ = _spec("QuantGemm", {"x_scale": 0.02, "out_scale": None} | EPI, _gemm_case(g, (8,), 32, 16))
    t = registry.get(tactic)
    assert {c["layout"] for c in t.configs(conv, CPU, 2)} == {"nhwc"}
    assert all("layout" not in c for c in t.configs(gemm, CPU, 2))
