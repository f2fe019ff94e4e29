"""cublaslt_fused_gemm's GELU epilogue config: offered for GELU in fp16 / bf16 only, one addmm-with-GELU call whose
result is within the autotuner's fp16 tolerance of the reference (exact erf GELU), written into the planned buffer."""

import pytest
import torch

from kiln.builder.autotune import TOLERANCE
from kiln.ir import DType
from kiln.kinds import run_reference
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from kiln.target.device import Device

CPU = Device("cpu", "cpu", "cpu")
M, K, N = 6, 32, 24


def _spec(dtype: torch.dtype, activation: str):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(N, K, generator=g).to(dtype), torch.randn(N, generator=g).to(dtype)
    dt = DType.from_torch(dtype)
    attrs = {"trans_b": True, "activation": activation, "activation_params": []}
    spec = LayerSpec("g", "FusedGemm", attrs, (ValueSpec(dt, (2, M // 2, K)), ValueSpec(dt, (N, K), w),
                                               ValueSpec(dt, (N,), b)), (ValueSpec(dt, (2, M // 2, N)),))
    return spec, w, b


def test_offered_for_half_precision_gelu_only():
    tactic = registry.get("cublaslt_fused_gemm")
    assert {"epilogue": "gelu"} in tactic.configs(_spec(torch.float16, "Gelu")[0], CPU, 2)
    assert {"epilogue": "gelu"} in tactic.configs(_spec(torch.bfloat16, "GeluTanh")[0], CPU, 2)
    assert tactic.configs(_spec(torch.float32, "Gelu")[0], CPU, 2) == [{}]
    assert tactic.configs(_spec(torch.float16, "Relu")[0], CPU, 2) == [{}]


@pytest.mark.parametrize("activation", ["Gelu", "GeluTanh"])
def test_matches_reference_within_fp16_tolerance_into_the_buffer(activation):
    spec, w, b = _spec(torch.float16, activation)
    x = torch.randn(2, M // 2, K, generator=torch.Generator().manual_seed(1)).half()
    want = run_reference("FusedGemm", [x.float(), w.float(), b.float()], spec.attrs)[0]
    buf = torch.empty(M * N * 2, dtype=torch.uint8)
    got = registry.get("cublaslt_fused_gemm").compile(spec, {"epilogue": "gelu"}, CPU)([x, None, None], [buf])[0]
    rtol, atol = TOLERANCE[torch.float16]
    assert got.shape == (2, M // 2, N) and got.dtype == torch.float16
    assert torch.allclose(got.float(), want, rtol=rtol, atol=atol)
    assert got.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
