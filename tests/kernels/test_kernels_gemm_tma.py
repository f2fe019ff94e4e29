"""The TMA-fed fp16 / bf16 GEMM (kernels/gemm_tma.py) and the triton_tma_gemm tactic against the references.

On the CPU the kernel runs under TRITON_INTERPRET=1 at tiny shapes; the gpu tests run BERT-base's GEMM shapes."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.kernels import gemm_tma  # noqa: E402
from kiln.kernels.common import tma_dense  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from tests.kernels.test_kernels_gemm import ACTS, CPU, _check, _spec  # noqa: E402

TINY = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
# bf16 only on the GPU: triton 3.6's interpreter garbles tl.dot of bf16 tiles loaded through tensor descriptors
DEV = "cuda" if torch.cuda.is_available() else "cpu"
HALVES = [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("act", ["none", "relu", "gelu_erf"])
@pytest.mark.parametrize("persistent", [False, True])
def test_kernel_edges_bias_activation(dtype, act, persistent):
    """M, N and K that cut every tile (TMA's zero fill and clipped stores), bias, activation, both loop forms."""
    g = torch.Generator().manual_seed(1)
    a, w, b = (torch.randn(s, generator=g).to(DEV, dtype) for s in ((37, 40), (24, 40), (24,)))
    got = gemm_tma.matmul(a, w, b, activation=act, config=dict(TINY, persistent=persistent))
    _check(got, ACTS[act](a.float() @ w.float().t() + b.float()).to(dtype))


def test_kernel_writes_out_and_copies_unaligned_operands():
    """An `out` buffer receives the result; a column view of A (rows off 16-byte boundaries) and a contiguous A
    whose start is off one are copied first."""
    a = torch.randn(20, 41).half()[:, 1:]
    w = torch.randn(16, 40).half()
    buf = torch.empty(20 * 16 * 2, dtype=torch.uint8)
    got = gemm_tma.matmul(a, w, config=TINY, out=buf)
    assert got.data_ptr() == buf.data_ptr()
    _check(got, (a.float() @ w.float().t()).half())
    flat = torch.randn(20 * 40 + 1).half()
    shifted = flat[1:].view(20, 40)  # contiguous, but 2 bytes off a 16-byte boundary: copied
    assert shifted.is_contiguous() and not tma_dense(shifted) and tma_dense(gemm_tma._addressed(shifted))
    _check(gemm_tma.matmul(shifted, w, config=TINY), (shifted.float() @ w.float().t()).half())
    with pytest.raises(ValueError, match="multiples of 8"):
        gemm_tma.matmul(torch.randn(4, 12).half(), torch.randn(8, 12).half(), config=TINY)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_fused_gemm_tactic(trans_b):
    """FusedGemm with an N-D A, W or Wᵀ, bias and erf GELU, through the tactic's first config shrunk to TINY."""
    w = torch.randn((24, 40) if trans_b else (40, 24)).half()
    inputs = [torch.randn(2, 3, 40).half(), w, torch.randn(24).half()]
    spec, want = _spec("FusedGemm", {"trans_b": trans_b, "activation": "Gelu", "activation_params": []}, inputs,
                       consts={1, 2})
    tactic = registry.get("triton_tma_gemm")
    assert tactic.supports(spec, CPU) is None
    _check(tactic.compile(spec, TINY, CPU)(inputs)[0], want[0])


def test_supports_reasons():
    """fp32, K or N off TMA's 16-byte rows and a non-constant weight are refused, each with its reason."""
    tactic = registry.get("triton_tma_gemm")
    a, w = torch.randn(4, 16), torch.randn(16, 24)
    assert "fp16" in tactic.supports(_spec("MatMul", {}, [a, w], consts={1})[0], CPU)
    assert "multiples of 8" in tactic.supports(_spec("MatMul", {}, [a.half(), w[:, :20].half()], consts={1})[0], CPU)
    assert "constant" in tactic.supports(_spec("MatMul", {}, [a.half(), w.half()], consts=set())[0], CPU)


def test_configs_fit_shared_memory_and_the_problem():
    """Every config fits the device's shared memory, in plain and persistent forms; level ≤ 1 offers two."""
    many = gemm_tma.configs(8192, 3072, 768, 227 * 1024)
    assert all(gemm_tma.smem_bytes(c) <= 227 * 1024 for c in many)
    assert sum(c.get("persistent", False) for c in many) * 2 == len(many) > 4
    small = gemm_tma.configs(16, 24, 40, 99 * 1024)
    assert small and all(c["BLOCK_N"] <= 64 and gemm_tma.smem_bytes(c) <= 99 * 1024 for c in small)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(8192, 3072, 768), (8192, 768, 3072), (128, 2304, 768), (1000, 1000, 1000)])
def test_gpu_every_config(mnk):
    """BERT-base's GEMMs (and a shape that cuts the tiles): every config compiles and matches, with erf GELU."""
    m, n, k = mnk
    inputs = [torch.randn(m, k, device="cuda").half(), (torch.randn(k, n, device="cuda") / k ** 0.5).half(),
              torch.randn(n, device="cuda").half()]
    spec, want = _spec("FusedGemm", {"trans_b": 0, "activation": "Gelu", "activation_params": []}, inputs,
                       consts={1, 2})
    tactic, device = registry.get("triton_tma_gemm"), Device("cuda", torch.cuda.get_device_name(0), "cuda")
    assert tactic.supports(spec, device) is None
    for config in tactic.configs(spec, device, 5):
        _check(tactic.compile(spec, config, device)(inputs)[0], want[0])
