"""Triton GEMM kernel and the triton_matmul / triton_gemm tactics against the MatMul / Gemm references.

On the CPU the kernels run under TRITON_INTERPRET=1 at tiny shapes; the gpu tests run BERT-sized ones.
Tolerances: fp32 1e-5 (the kernel accumulates in fp32 like the reference, only the order differs);
fp16 / bf16 are the autotuner's (one or two roundings of the output in the half type).
"""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.builder.autotune import TOLERANCE  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.ir import DType  # noqa: E402
from kiln.kernels import common, gemm  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402

TOL = {**TOLERANCE, torch.float32: (1e-5, 1e-5)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CPU = Device("cpu", "cpu", "cpu")
SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
ACTS = {"none": lambda x: x, "relu": torch.relu, "gelu_erf": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "sigmoid": torch.sigmoid}


def _spec(kind, attrs, inputs, consts):
    """The LayerSpec of a layer with these inputs (indices in `consts` are constants) and its reference outputs."""
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape), t if i in consts else None)
                 for i, t in enumerate(inputs))
    want = run_reference(kind, inputs, attrs)
    outs = tuple(ValueSpec(DType.from_torch(w.dtype), tuple(w.shape)) for w in want)
    return LayerSpec("l", kind, attrs, vals, outs), want


def _check(got, want):
    rtol, atol = TOL[want.dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(ACTS))
def test_kernel_epilogue(dtype, act):
    """alpha · A @ W + beta · bias, then the activation, on edges that cut every tile dim."""
    g = torch.Generator().manual_seed(0)
    a, w, b = (torch.randn(s, generator=g).to(dtype) for s in ((37, 50), (50, 45), (45,)))
    got = gemm.matmul(a, w, b, alpha=0.5, beta=2.0, activation=act, config=SMALL)
    want = ACTS[act](0.5 * a.float() @ w.float() + 2.0 * b.float()).to(dtype)
    _check(got, want)


def test_kernel_strided_operands_and_default_config():
    """Transposed views run through their strides; no config means the default one."""
    a, w = torch.randn(20, 33).t(), torch.randn(24, 20).t()
    _check(gemm.matmul(a, w), a @ w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left", [(2, 3, 40), (40,), (5, 40)])
def test_matmul_tactic(dtype, left):
    """N-D (and 1-D) left operands are flattened to rows and the result reshaped back."""
    inputs = [torch.randn(left).to(dtype), torch.randn(40, 24).to(dtype)]
    spec, want = _spec("MatMul", {}, inputs, consts={1})
    tactic = registry.get("triton_matmul")
    assert tactic.supports(spec, CPU) is None
    _check(tactic.compile(spec, SMALL, CPU)(inputs)[0], want[0])


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 1), (0, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (24,), (9, 1), (9, 24)])
def test_gemm_tactic(trans_a, trans_b, c_shape):
    """Transposes, alpha, beta and every broadcast form of C (constant or not)."""
    a = torch.randn((40, 9) if trans_a else (9, 40))
    b = torch.randn((24, 40) if trans_b else (40, 24))
    c = None if c_shape is None else torch.randn(c_shape)
    attrs = {"alpha": 0.7, "beta": 1.5, "transA": trans_a, "transB": trans_b}
    inputs = [a, b] + ([] if c is None else [c])
    spec, want = _spec("Gemm", attrs, inputs, consts={1})
    tactic = registry.get("triton_gemm")
    assert tactic.supports(spec, CPU) is None
    config = tactic.configs(spec, CPU, 0)[0]
    _check(tactic.compile(spec, config, CPU)(inputs)[0], want[0])


FUSED_ACTS = [("none", []), ("Relu", []), ("Sigmoid", []), ("Tanh", []), ("HardSwish", []), ("SiLU", []),
              ("Gelu", []), ("GeluTanh", []), ("LeakyRelu", [0.1]), ("Clip", [0.0, 6.0]), ("Clip", [None, 0.5])]


@pytest.mark.parametrize("act,params", FUSED_ACTS)
@pytest.mark.parametrize("trans_b", [0, 1])
def test_fused_gemm_tactic(act, params, trans_b):
    """FusedGemm: N-D A, W or Wᵀ, bias, every epilogue activation the fusion pass writes."""
    w = torch.randn((24, 40) if trans_b else (40, 24))
    inputs = [torch.randn(2, 3, 40), w, torch.randn(24)]
    attrs = {"trans_b": trans_b, "activation": act, "activation_params": params}
    spec, want = _spec("FusedGemm", attrs, inputs, consts={1, 2})
    tactic = registry.get("triton_fused_gemm")
    assert tactic.supports(spec, CPU) is None
    _check(tactic.compile(spec, SMALL, CPU)(inputs)[0], want[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_gemm_half_without_bias(dtype):
    inputs = [torch.randn(5, 40).to(dtype), torch.randn(40, 24).to(dtype)]
    spec, want = _spec("FusedGemm", {"trans_b": 0, "activation": "Gelu", "activation_params": []}, inputs, consts={1})
    _check(registry.get("triton_fused_gemm").compile(spec, SMALL, CPU)(inputs)[0], want[0])


def test_supports_reasons(monkeypatch):
    a, w = torch.randn(4, 8), torch.randn(8, 16)
    spec, _ = _spec("MatMul", {}, [a, w], consts=set())
    assert "constant" in registry.get("triton_matmul").supports(spec, CPU)
    spec, _ = _spec("MatMul", {}, [a.int(), w.int()], consts={1})
    assert "float" in registry.get("triton_matmul").supports(spec, CPU)
    spec, _ = _spec("Gemm", {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}, [a, w], consts=set())
    assert "constant" in registry.get("triton_gemm").supports(spec, CPU)
    spec, _ = _spec("FusedGemm", {"trans_b": 0, "activation": "Mish", "activation_params": []}, [a, w], consts={1})
    assert "Mish" in registry.get("triton_fused_gemm").supports(spec, CPU)
    monkeypatch.setattr(common, "capability", lambda device: (7, 5))
    spec, _ = _spec("MatMul", {}, [a.bfloat16(), w.bfloat16()], consts={1})
    assert "compute capability 8.0" in registry.get("triton_matmul").supports(spec, CPU)


@pytest.mark.parametrize("smem", [48 * 1024, 99 * 1024, 227 * 1024])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_configs_fit_shared_memory(smem, itemsize):
    """Every offered config fits the device's shared memory; levels 0-1 offer one, higher levels more."""
    assert len(gemm.configs(128, 768, 3072, itemsize, smem, 1)) == 1
    many = gemm.configs(128, 768, 3072, itemsize, smem, 3)
    assert len(many) > 3 and all(gemm.smem_bytes(c, itemsize) <= smem for c in many)
    assert len({tuple(sorted(c.items())) for c in many}) == len(many)


def test_configs_shrink_to_small_problems():
    (cfg,) = gemm.configs(8, 20, 16, 2, 227 * 1024, 0)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) == (16, 32, 16)
    assert all(c["BLOCK_M"] <= 16 for c in gemm.configs(8, 20, 16, 2, 227 * 1024, 5)[1:])


def _cuda():
    return Device("cuda", torch.cuda.get_device_name(0), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mnk", [(128, 3072, 768), (128, 768, 3072), (128, 2304, 768), (1000, 1000, 1000)])
def test_gpu_matmul_every_config(dtype, mnk):
    """BERT-base GEMMs: every config the tactic offers at level 5 compiles and matches the reference."""
    m, n, k = mnk
    inputs = [torch.randn(1, m, k, device="cuda").to(dtype), (torch.randn(k, n, device="cuda") / k ** 0.5).to(dtype)]
    spec, want = _spec("MatMul", {}, inputs, consts={1})
    tactic, device = registry.get("triton_matmul"), _cuda()
    assert tactic.supports(spec, device) is None
    for config in tactic.configs(spec, device, 5):
        _check(tactic.compile(spec, config, device)(inputs)[0], want[0])


@pytest.mark.gpu
@pytest.mark.parametrize("act", list(ACTS))
def test_gpu_epilogue_fp16(act):
    a = torch.randn(128, 768, device="cuda", dtype=torch.float16)
    w = torch.randn(768, 3072, device="cuda", dtype=torch.float16) / 768 ** 0.5
    b = torch.randn(3072, device="cuda", dtype=torch.float16)
    want = ACTS[act](a.float() @ w.float() + b.float()).half()
    _check(gemm.matmul(a, w, b, activation=act), want)


@pytest.mark.gpu
def test_gpu_fp32_is_true_fp32_unless_tf32():
    """Without --tf32 the fp32 GEMM keeps fp32 accuracy (TF32 would miss 1e-5 at K=3072)."""
    a, w = torch.randn(128, 3072, device="cuda"), torch.randn(3072, 768, device="cuda")
    want = (a.double() @ w.double()).float()
    torch.testing.assert_close(gemm.matmul(a, w, config=gemm.configs(128, 768, 3072, 4, 48 * 1024, 0)[0]), want,
                               rtol=1e-4, atol=1e-3)  # |values| ~ 55; fp32 accumulation over 3072 terms


@pytest.mark.parametrize("split", [2, 3, 5])
def test_split_k_epilogue_and_counts_reset(split, monkeypatch):
    """Split-K over K = 100 (a ragged last block; 7 steps of 16, unevenly split) with alpha, beta·bias and an
    activation applied once after the sum; the same answer twice, so every tile's count is back at zero."""
    monkeypatch.setattr(common, "sm_count", lambda device: 132)  # the interpreter's 2 would call 6 tiles a full GPU
    g = torch.Generator().manual_seed(split)
    a, w, b = (torch.randn(s, generator=g) for s in ((37, 100), (100, 45), (45,)))
    want = torch.relu(0.5 * a @ w + 2.0 * b)
    scratch = common.SplitScratch()
    for _ in range(2):
        _check(gemm.matmul(a, w, b, alpha=0.5, beta=2.0, activation="relu", config=SMALL | {"SPLIT_K": split},
                           scratch=scratch), want)
    (ws, counts), = scratch._sets.values()
    assert counts.tolist() == [0] * 6 and ws.numel() == common.step_slice(7, split)[1] * 6 * 16 * 32


def test_gemm_tactic_split_k_config(monkeypatch):
    monkeypatch.setattr(common, "sm_count", lambda device: 132)
    inputs = [torch.randn(3, 96), torch.randn(96, 20)]
    spec, want = _spec("MatMul", {}, inputs, consts={1})
    _check(registry.get("triton_matmul").compile(spec, SMALL | {"SPLIT_K": 3}, CPU)(inputs)[0], want[0])


def test_split_configs_for_a_classifier_gemv_only():
    """ResNet-50's classifier at batch 1 (1 x 2048 → 1000) gets split-K configs; the same GEMM at batch 4096 does
    not, nor anything at level 1."""
    gemv = [c for c in gemm.configs(1, 1000, 2048, 2, 227 * 1024, 3, sms=132) if "SPLIT_K" in c]
    assert gemv and all(c["BLOCK_M"] <= 64 and 2 * c["SPLIT_K"] <= 2048 // c["BLOCK_K"] for c in gemv)
    assert not [c for c in gemm.configs(4096, 1000, 2048, 2, 227 * 1024, 3, sms=132) if "SPLIT_K" in c]
    assert len(gemm.configs(1, 1000, 2048, 2, 227 * 1024, 1, sms=132)) == 1


def test_split_configs_from_a_tile_that_underfills():
    """BERT-base's FFN down-projection at batch 1 (128 x 3072 → 768): the default tile alone fills the GPU (96 tiles
    of 32 x 32), so the split-K configs come from the first small-row tile that does not (64 x 128: 12 tiles)."""
    split = [c for c in gemm.configs(128, 768, 3072, 2, 227 * 1024, 3, sms=132) if "SPLIT_K" in c]
    assert split and all(2 * (128 // c["BLOCK_M"]) * (768 // c["BLOCK_N"]) <= 132 for c in split)
    assert any(66 <= 2 * 6 * c["SPLIT_K"] <= 264 for c in split)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 1000, 2048), (8, 768, 3072), (49, 512, 4608), (128, 768, 3072)])
def test_gpu_split_k_small_rows_every_config(m, n, k):
    """Few-row GEMMs (ResNet-50's classifier at batch 1, a FFN down-projection over 8 rows, the im2col form of
    its last 3x3 conv), fp16 with bias and GELU: every config at level 3, split-K among them, three calls each on
    the GPU's atomics."""
    a = torch.randn(m, k, device="cuda").half()
    w, b = (torch.randn(k, n, device="cuda") * 0.02).half(), torch.randn(n, device="cuda").half()
    want = F.gelu(a.float() @ w.float() + b.float()).half()
    configs = gemm.configs(m, n, k, 2, 227 * 1024, 3, sms=torch.cuda.get_device_properties(0).multi_processor_count)
    assert any("SPLIT_K" in c for c in configs)
    scratch = common.SplitScratch()
    for cfg in configs:
        for _ in range(3):
            _check(gemm.matmul(a, w, b, activation="gelu_erf", config=cfg, scratch=scratch), want)
