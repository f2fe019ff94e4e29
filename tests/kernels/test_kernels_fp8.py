"""fp8 tactics (torch_scaled_mm, triton_fp8_gemm, triton_fp8_conv, triton_quantize to fp8) against the references.

On the CPU torch._scaled_mm runs its CPU kernel (the weight and activation padding to multiples of 16 is the CUDA
rule, applied anyway) and the Triton kernels run under TRITON_INTERPRET=1 at tiny shapes; the GPU tests (marked
gpu) take BERT and ResNet shapes on a device of compute capability 8.9 or later. fp8 sums are fp32 sums in any
order, so results are judged with the autotuner's fp8 tolerance (builder/autotune.py): an fp32/fp16 output within
2e-3 relative plus 1e-3 of its range, an fp8 output within one e4m3 step.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kiln  # noqa: E402
from kiln.builder.autotune import _close, _random_input, fp8_slack  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.ir import DType  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402
from test_kernels_int8 import CONVS as INT8_CONVS, _spec  # noqa: E402

F8 = torch.float8_e4m3fn
CPU = Device("cpu", "cpu", "cpu")
SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
SMALL_CONV = {"layout": "nhwc", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
GEMM_TACTICS = ["torch_scaled_mm", "triton_fp8_gemm", "triton_fp8_gemm_tma"]
CONV_TACTICS = GEMM_TACTICS + ["triton_fp8_conv"]
EPI = {"activation": "none", "activation_params": [], "qtype": "fp8e4m3"}


def _f8(g, *shape, s=60.0):
    return (torch.randn(*shape, generator=g) * s).clamp(-448, 448).to(F8)


def _gemm_case(g, lead, k, n, bias=True):
    ws = torch.rand(n, generator=g) * 1e-3 + 1e-4
    return [_f8(g, *lead, k), _f8(g, n, k), ws, torch.randn(n, generator=g) if bias else None]


def _conv_case(g, n, c, hw, m, k):
    return [_f8(g, n, c, hw, hw), _f8(g, m, c, k, k), torch.rand(m, generator=g) * 1e-3 + 1e-4,
            torch.randn(m, generator=g)]


def _config(tactic, spec, device):
    if device.backend == "cuda":
        return registry.get(tactic).configs(spec, device, 1)[0]
    return {"torch_scaled_mm": {}, "triton_fp8_conv": SMALL_CONV}.get(tactic, SMALL)


def _run(tactic, spec, inputs, device=CPU):
    t = registry.get(tactic)
    assert t.supports(spec, device) is None
    return t.compile(spec, _config(tactic, spec, device), device)(inputs)[0]


def _check(got, want, spec, inputs):
    """Within the autotuner's fp8 tolerance: one e4m3 step, plus the accumulation slack of fp8 tensor cores."""
    assert got.dtype == want.dtype and got.shape == want.shape
    assert _close([got], [want], False, quantized=True, fp8=True, slack=fp8_slack(spec, inputs)) is None


@pytest.mark.parametrize("tactic", GEMM_TACTICS)
@pytest.mark.parametrize("lead,k,n", [((5,), 40, 24), ((2, 3), 37, 13), ((33,), 64, 70)])
@pytest.mark.parametrize("out_scale", [None, 0.05])
def test_fp8_quant_gemm(tactic, lead, k, n, out_scale):
    """K and N not multiples of 16 (padded for _scaled_mm), N-D rows; fp32 or requantized fp8 out, Relu."""
    g = torch.Generator().manual_seed(k * n)
    attrs = EPI | {"x_scale": 0.02, "out_scale": out_scale, "activation": "Relu"}
    spec, inputs, want = _spec("QuantGemm", attrs, _gemm_case(g, lead, k, n, bias=n != 13))
    _check(_run(tactic, spec, inputs), want, spec, inputs)


CONVS = INT8_CONVS[:4]  # 1x1, strided 1x1, padded 3x3, strided dilated 3x3 (the 7x7 stem is slow interpreted)


@pytest.mark.parametrize("tactic", CONV_TACTICS)
@pytest.mark.parametrize("kernel,strides,pads,dilations", CONVS)
def test_fp8_quant_conv(tactic, kernel, strides, pads, dilations):
    """1x1 (strided) and kxk (padded: zero bytes are +0.0 in e4m3), residual, bias; fp32 and fp8 out."""
    g = torch.Generator().manual_seed(kernel * 10 + strides[0])
    inputs = _conv_case(g, 2, 3, 9, 10, kernel)
    attrs = EPI | {"group": 1, "auto_pad": "NOTSET", "dilations": dilations, "kernel_shape": [kernel, kernel],
                   "pads": pads, "strides": strides, "x_scale": 0.1, "out_scale": None}
    inputs.append(torch.randn(run_reference("QuantConv", inputs, attrs)[0].shape, generator=g))
    for out_scale, act in ((None, "none"), (0.5, "Relu")):
        spec, args, want = _spec("QuantConv", attrs | {"out_scale": out_scale, "activation": act}, inputs)
        _check(_run(tactic, spec, args), want, spec, args)


@pytest.mark.parametrize("tactic", CONV_TACTICS)
def test_fp8_quant_conv_fp8_residual(tactic):
    """An fp8 residual with res_scale (a previous block's fp8 output), fp32 and fp8 out, within the fp8 tolerance."""
    g = torch.Generator().manual_seed(21)
    inputs = _conv_case(g, 2, 3, 9, 10, 3)
    attrs = EPI | {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1] * 4,
                   "strides": [1, 1], "x_scale": 0.1, "out_scale": None, "res_scale": 0.0071}
    inputs.append(_f8(g, *run_reference("QuantConv", inputs, attrs)[0].shape))
    for out_scale, act in ((None, "none"), (0.5, "Relu")):
        spec, args, want = _spec("QuantConv", attrs | {"out_scale": out_scale, "activation": act}, inputs)
        _check(_run(tactic, spec, args), want, spec, args)


@pytest.mark.parametrize("tactic", CONV_TACTICS)
def test_fp8_conv_channels_last_input_gelu_and_fp16_out(tactic):
    """An NHWC input, as a previous quantized conv leaves it; Gelu; the fp16 output a fp16 reader gets."""
    g = torch.Generator().manual_seed(3)
    inputs = _conv_case(g, 1, 16, 6, 8, 1)
    inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)
    attrs = EPI | {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
                   "strides": [1, 1], "x_scale": 0.05, "out_scale": None, "activation": "Gelu"}
    for extra in ({}, {"out_scale": 0.01}, {"out_dtype": DType.FLOAT16}):
        spec, args, want = _spec("QuantConv", attrs | extra, inputs)
        _check(_run(tactic, spec, args), want, spec, args)


def test_fp8_and_int8_tactics_refuse_each_others_layers():
    g = torch.Generator().manual_seed(4)
    attrs = EPI | {"x_scale": 0.02, "out_scale": None}
    fp8_spec, _, _ = _spec("QuantGemm", attrs, _gemm_case(g, (4,), 32, 16))
    for name in ("torch_int_mm", "triton_int8_gemm", "triton_int8_conv"):
        assert registry.get(name).supports(fp8_spec, CPU) is not None
    assert "int8 layers only" in registry.get("torch_int_mm").supports(fp8_spec, CPU)
    i8 = [torch.randint(-127, 128, (4, 32), dtype=torch.int8), torch.randint(-127, 128, (16, 32), dtype=torch.int8),
          torch.rand(16), None]
    int8_spec, _, _ = _spec("QuantGemm", {"x_scale": 0.02, "out_scale": None, "activation": "none",
                                          "activation_params": []}, i8)
    for name in GEMM_TACTICS:
        assert "fp8 layers only" in registry.get(name).supports(int8_spec, CPU)
    assert all(registry.get(n).arch_specific for n in CONV_TACTICS)  # kept out of --hardware-compat portable


def test_fp8_tactics_need_compute_capability_8_9(monkeypatch):
    """On a CUDA device below 8.9 (an A100 here, faked) the fp8 tactics say why they cannot run."""
    g = torch.Generator().manual_seed(5)
    spec, _, _ = _spec("QuantGemm", EPI | {"x_scale": 0.02, "out_scale": None}, _gemm_case(g, (4,), 32, 16))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    a100 = Device("cuda", "NVIDIA A100", "cuda:0")
    for name in GEMM_TACTICS:
        assert "8.9" in registry.get(name).supports(spec, a100)


def test_triton_quantize_to_fp8_rounds_to_nearest_even_and_saturates():
    """Every e4m3 value, every midpoint between neighbours (ties to the even code) and its two neighbours in fp32,
    values beyond ±448, tiny ones: bit-for-bit the reference (torch's fp32 → e4m3 conversion)."""
    from kiln.kernels import quantize

    codes = torch.arange(256, dtype=torch.uint8).view(F8).float()
    values = codes[codes.isfinite()].unique()
    mids = (values[1:] + values[:-1]) / 2
    x = torch.cat([values, mids, mids.nextafter(torch.tensor(1e9)), mids.nextafter(torch.tensor(-1e9)),
                   torch.tensor([450.0, 464.0, 480.0, 1e6, -1e6, 1e-12, 0.0]),
                   torch.randn(3000, generator=torch.Generator().manual_seed(0)) * 100])
    attrs = {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": DType.FP8E4M3, "precision": DType.FLOAT32}
    for scale in (1.0, 0.37):
        for t in (x * scale, (x * scale).half()):
            want = run_reference("QuantizeLinear", [t, torch.tensor(scale)], attrs)[0]
            got = quantize.quantize(t, scale, quantize.CONFIGS[2], F8)
            assert got.dtype == F8 and torch.equal(got.float(), want.float())
    spec = LayerSpec("q", "QuantizeLinear", attrs, (ValueSpec(DType.FLOAT32, (8,)),
                                                    ValueSpec(DType.FLOAT32, (), torch.tensor(0.5))),
                     (ValueSpec(DType.FP8E4M3, (8,)),))
    t = registry.get("triton_quantize")
    assert t.supports(spec, CPU) is None
    assert t.compile(spec, quantize.CONFIGS[0], CPU)([torch.arange(8.0)])[0].float().tolist() == \
        [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
    unsaturated = LayerSpec("q", "QuantizeLinear", attrs | {"saturate": False}, spec.inputs, spec.outputs)
    assert "saturation" in t.supports(unsaturated, CPU)


def test_autotuner_fp8_inputs_and_tolerance():
    """fp8 layers are timed on data over most of the e4m3 range; one e4m3 step on an fp8 output passes, two do not;
    an fp32 output 1e-4 off passes, 1e-2 off of the range does not."""
    x = _random_input(ValueSpec(DType.FP8E4M3, (64, 64)), "cpu")
    assert x.dtype == F8 and x.float().abs().max() >= 256 and x.float().abs().median() > 16
    want = torch.tensor([1.0, 1.875, -3.0, 0.0, 448.0]).to(F8)
    up = torch.tensor([1.125, 2.0, -3.25, 2.0 ** -9, 448.0]).to(F8)       # one step each
    two = torch.tensor([1.25, 2.25, -3.5, 2.0 ** -8, 384.0]).to(F8)       # two steps each
    assert _close([up], [want], False, True, fp8=True) is None
    assert "wrong result" in _close([two], [want], False, True, fp8=True)
    y = torch.randn(100) * 50
    assert _close([y * (1 + 1e-4)], [y], False, True, fp8=True) is None
    assert "wrong result" in _close([y + 1e-2 * y.abs().max()], [y], False, True, fp8=True)


# GPU: run on an H100 (or any GPU of compute capability >= 8.9) with
#   .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_kernels_fp8.py tests/test_quant_fp8.py -m gpu -rs


def _gpu_fp8() -> Device:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip(f"fp8 needs compute capability 8.9; {torch.cuda.get_device_name()} has "
                    f"{'.'.join(map(str, torch.cuda.get_device_capability()))}")
    return Device("cuda", torch.cuda.get_device_name(), "cuda:0")


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", GEMM_TACTICS)
@pytest.mark.parametrize("lead,k,n", [((5,), 40, 24), ((33,), 64, 70), ((64, 128), 768, 3072)])
@pytest.mark.parametrize("out_scale", [None, 0.05])
def test_gpu_fp8_gemm(tactic, lead, k, n, out_scale):
    """Small shapes and BERT's FFN (M=8192, K=768, N=3072) on the GPU, within the autotuner's fp8 tolerance."""
    dev = _gpu_fp8()
    g = torch.Generator().manual_seed(k)
    attrs = EPI | {"x_scale": 0.02, "out_scale": out_scale, "activation": "Gelu"}
    spec, inputs, want = _spec("QuantGemm", attrs, _gemm_case(g, lead, k, n), "cuda")
    _check(_run(tactic, spec, inputs, dev), want, spec, inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", CONV_TACTICS)
@pytest.mark.parametrize("n,c,hw,m,k", [(2, 3, 9, 10, 3), (8, 64, 56, 64, 3), (8, 256, 14, 1024, 1)])
def test_gpu_fp8_conv(tactic, n, c, hw, m, k):
    """A 3-channel stem-like conv and ResNet 3x3 / 1x1 convs, NHWC input, fp8 and fp32 out."""
    dev = _gpu_fp8()
    g = torch.Generator().manual_seed(c)
    inputs = _conv_case(g, n, c, hw, m, k)
    inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)
    attrs = EPI | {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [k, k],
                   "pads": [k // 2] * 4, "strides": [1, 1], "x_scale": 0.1, "activation": "Relu"}
    for out_scale in (None, 0.3):
        spec, args, want = _spec("QuantConv", attrs | {"out_scale": out_scale}, inputs, "cuda")
        _check(_run(tactic, spec, args, dev), want, spec, args)


@pytest.mark.gpu
def test_gpu_triton_quantize_fp8_matches_reference():
    _gpu_fp8()
    from kiln.kernels import quantize

    x = torch.randn(1 << 16, device="cuda") * 300
    attrs = {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": DType.FP8E4M3, "precision": DType.FLOAT32}
    want = run_reference("QuantizeLinear", [x, torch.tensor(0.7, device="cuda")], attrs)[0]
    assert torch.equal(quantize.quantize(x, 0.7, dtype=F8).float(), want.float())


@pytest.mark.gpu
def test_gpu_fp8_build_chooses_fp8_tactics_and_matches_fp32(tmp_path):
    """An fp8 engine of the small CNN built and tuned on the GPU: fp8 tactics chosen, cosine vs fp32 as on the CPU."""
    _gpu_fp8()
    import numpy as np

    from test_quant_fp8 import _cnn, _cosine

    path, x = _cnn(tmp_path)
    config = dict(calib=str(tmp_path / "calib.npz"), calibrator="minmax", opt_level=1)
    want = kiln.build(path, kiln.BuildConfig.with_shapes({"x": x.shape}, device="cpu")).run({"x": x})["y"]
    e = kiln.build(path, kiln.BuildConfig.with_shapes({"x": x.shape}, device="cuda", fp8=True, **config))
    chosen = {e.tactics[la.name].tactic for la in e.network.layers if la.kind in ("QuantGemm", "QuantConv")}
    assert chosen and chosen <= {"torch_scaled_mm", "triton_fp8_gemm", "triton_fp8_conv"}, chosen
    quantize = {e.tactics[la.name].tactic for la in e.network.layers if la.kind == "QuantizeLinear"}
    assert quantize <= {"triton_quantize"}, quantize
    assert _cosine(np.asarray(e.run({"x": x})["y"]), want) >= 0.997


@pytest.mark.gpu
def test_gpu_fp8_refused_below_8_9(tmp_path):
    """On a GPU without fp8 tensor cores, --fp8 is a ConfigError naming it (skipped on 8.9 and later)."""
    if torch.cuda.get_device_capability() >= (8, 9):
        pytest.skip("this GPU has fp8 tensor cores")
    from kiln.errors import ConfigError
    from test_quant_fp8 import _mlp

    path, _ = _mlp(tmp_path)
    with pytest.raises(ConfigError, match=torch.cuda.get_device_name()):
        kiln.build(path, kiln.BuildConfig(device="cuda", fp8=True, calib=str(tmp_path / "calib.npz")))


_AOT = '''
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kiln.kernels import int8_conv, int8_conv_tma, int8_gemm, int8_gemm_tma, pool, quantize, space_to_depth

def build(fn, sig, consts, cc):
    sig = dict(sig) | {k: "constexpr" for k in consts}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", cc, 32))

f8, cc = "*fp8e4nv", int(sys.argv[1])
gemm = dict(zip("a w scale bias res c M N K out_inv res_scale act_alpha act_beta".split(),
                [f8, f8, "*fp32", "*fp32", "*fp16", f8, "i32", "i32", "i32", "fp32", "fp32", "fp32", "fp32"]))
gemm |= {k: "i32" for k in "s_am s_ak s_wk s_wn s_rm s_rn s_cm s_cn".split()}
k = build(int8_gemm._int8_gemm_kernel, gemm, {"HAS_BIAS": True, "HAS_RES": True, "RES_Q": False, "REQUANT": True,
          "ACT": "relu", "FP8": True, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64,
          "GROUP_M": 8}, cc)
assert "cvt.rn.satfinite.e4m3x2" in k.asm["ptx"] and ("wgmma" in k.asm["ptx"]) == (cc >= 90)
conv = dict(zip("x w scale bias res y".split(), [f8, f8, "*fp32", "*fp32", "*fp16", "*fp16"]))
conv |= {k: "i32" for k in "N H W C OH OW CO KW sh sw ph pw dh dw NUM_K KTOT".split()}
conv |= {k: "fp32" for k in "out_inv res_scale act_alpha act_beta".split()} | {"s_wk": "i32", "s_wn": "i32"}
conv |= {k: "i32" for k in "s_xn s_xc s_xh s_xw s_rn s_rc s_rh s_rw s_yn s_yc s_yh s_yw".split()}
tiles = {"FLAT_K": False, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}
build(int8_conv._int8_conv_kernel, conv | {"res": f8}, {"HAS_BIAS": True, "HAS_RES": True, "RES_Q": True,
      "REQUANT": False, "ACT": "none", "FP8": True} | tiles, cc)
i8 = {"x": "*i8", "w": "*i8", "res": "*i8", "y": "*i8"}  # int8, reading an int8 residual (res_scale) and requantizing
build(int8_conv._int8_conv_kernel, conv | i8, {"HAS_BIAS": True, "HAS_RES": True, "RES_Q": True, "REQUANT": True,
      "ACT": "relu", "FP8": False} | tiles, cc)
build(int8_conv._int8_conv_kernel, conv | i8, {"HAS_BIAS": True, "HAS_RES": False, "RES_Q": False, "REQUANT": True,
      "ACT": "relu", "FP8": False} | tiles | {"FLAT_K": True}, cc)  # a stem conv: taps and channels in one block
build(quantize._quantize_kernel, {"x": "*fp16", "q": f8, "n": "i32", "scale": "fp32"},
      {"FP8": True, "EXACT_DIV": True, "BLOCK": 1024}, cc)
if cc >= 90:  # the TMA-fed GEMM: int8 with an int8 residual, requantized
    tma = {"a_desc": "tensordesc<i8[128,64]>", "w_desc": "tensordesc<i8[128,64]>", "c_desc": "tensordesc<i8[128,128]>",
           "r_desc": "tensordesc<i8[128,128]>", "res": "*i8", "s_rm": "i32", "scale": "*fp32", "bias": "*fp32",
           "M": "i32", "N": "i32", "K": "i32"}
    tma |= {k: "fp32" for k in "out_inv res_scale act_alpha act_beta".split()}
    for early in (False, True):  # the residual by TMA after the reduction, or by pointers before it
        k = build(int8_gemm_tma._tma_gemm_kernel, tma, {"HAS_BIAS": True, "HAS_RES": True, "RES_Q": True,
                  "RES_EARLY": early, "REQUANT": True, "ACT": "relu", "FP8": False, "BLOCK_M": 128,
                  "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, cc)
        assert "wgmma" in k.asm["ptx"] and "cp.async.bulk.tensor" in k.asm["ptx"]
    k = build(int8_gemm_tma._tma_gemm_persistent_kernel, tma, {"HAS_BIAS": True, "HAS_RES": True, "RES_Q": True,
              "RES_EARLY": True, "REQUANT": True, "ACT": "relu", "FP8": False, "BLOCK_M": 128, "BLOCK_N": 128,
              "BLOCK_K": 64, "GROUP_M": 8}, cc)  # persistent: programs loop over tiles
    assert "wgmma" in k.asm["ptx"] and "cp.async.bulk.tensor" in k.asm["ptx"]
    ct = {"x_desc": "tensordesc<i8[1,8,16,64]>", "w_desc": "tensordesc<i8[64,64]>", "scale": "*fp32",
          "bias": "*fp32", "res": "*i8", "y": "*i8"}  # the TMA conv: 4-D input boxes
    ct |= {k: "i32" for k in "OH OW CO C KW ph pw dh dw".split()}
    ct |= {k: "fp32" for k in "out_inv res_scale act_alpha act_beta".split()}
    ct |= {k: "i32" for k in "s_rn s_rc s_rh s_rw s_yn s_yc s_yh s_yw NUM_K".split()}
    k = build(int8_conv_tma._conv_tma_kernel, ct, {"HAS_BIAS": True, "HAS_RES": True, "RES_Q": True,
              "REQUANT": True, "ACT": "relu", "FP8": False, "BH": 8, "BW": 16, "BLOCK_N": 64, "BLOCK_K": 64}, cc)
    assert "wgmma" in k.asm["ptx"] and "cp.async.bulk.tensor.4d" in k.asm["ptx"]
s2d = {"x": f8, "s": f8} | {k: "i32" for k in "H W HS WS pt pl s_xn s_xc s_xh s_xw".split()}
build(space_to_depth._s2d_kernel, s2d, {"C": 3, "FP8": True, "BLOCK_J": 128}, cc)  # a stem conv's input, fp8
mp = {"x": "*i8", "y": "*i8"} | {k: "i32" for k in "N C H W OH OW sh sw ph pw dh dw".split()}
mp |= {k: "i32" for k in "s_xn s_xc s_xh s_xw s_yn s_yc s_yh s_yw".split()}
build(pool._max_pool_kernel, mp, {"KH": 3, "KW": 3, "CLAMP": True, "BLOCK_P": 64, "BLOCK_C": 64}, cc)
print("compiled")
'''


@pytest.mark.parametrize("cc", [89, 90])
def test_fp8_kernels_compile_for_ada_and_hopper(cc):
    """The interpreter forgives what the compiler refuses (plain globals, fp8 casts): compile the fp8 GEMM, conv and
    quantize kernels to cubin for sm89 / sm90 with the ptxas Triton ships, no GPU needed (a subprocess, since this
    session's kernels were decorated for the interpreter)."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    r = subprocess.run([sys.executable, "-c", _AOT, str(cc)], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode and ("ptxas" in r.stderr and "not found" in r.stderr or "ImportError" in r.stderr):
        pytest.skip(f"no Triton CUDA toolchain here: {r.stderr.strip().splitlines()[-1][:200]}")
    assert r.returncode == 0 and "compiled" in r.stdout, r.stderr[-3000:]


def test_fp8_slack_is_a_fraction_of_the_terms_magnitudes():
    """Σ|x·w|·scales: terms that cancel leave a small result and a large allowance, the activation is not applied."""
    f8 = torch.tensor([[4.0, -4.0]]).to(F8)
    attrs = EPI | {"x_scale": 0.5, "out_scale": 0.25, "activation": "Relu"}
    spec, inputs, want = _spec("QuantGemm", attrs, [f8, torch.tensor([[8.0, 8.0]]).to(F8), torch.tensor([2.0]),
                                                    torch.tensor([-1.0])])
    assert want.float().item() == 0.0  # relu(4·8·1 - 4·8·1 - 1)
    assert fp8_slack(spec, inputs).item() == pytest.approx(2 ** -9 * (64 * 0.5 * 2 + 1) / 0.25)


def test_fp8_tolerance_is_one_step_of_the_larger_value():
    """GPU and reference sums that straddle a binade edge round to neighbours a step of the upper binade apart
    (112 vs 128: 16 = 1/8 of 128, more than 1/8 of 112); two steps apart is still a wrong result."""
    f8 = lambda v: torch.tensor(v).to(torch.float8_e4m3fn)  # noqa: E731
    assert _close([f8([128.0, -30.0])], [f8([112.0, -32.0])], False, quantized=True, fp8=True) is None
    assert _close([f8([144.0])], [f8([112.0])], False, quantized=True, fp8=True) is not None
