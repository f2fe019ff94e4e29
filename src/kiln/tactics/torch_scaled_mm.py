"""fp8 QuantGemm and QuantConv through torch._scaled_mm (cuBLASLt fp8 GEMM, fp32 out), the epilogue in torch ops;
compute capability 8.9 and later.

_scaled_mm takes A [M, K] row-major and B [K, N] column-major, both fp8, with K and N multiples of 16: the weight
is zero-padded to multiples of 16 and laid out column-major once at build; A is zero-padded to K's multiple of 16
at run time (a copy only for such layers). Zeros add nothing to the sums. Scales: the per-tensor form with
scale_a = scale_b = 1, and the combined x_scale·w_scale[n] applied in the epilogue as one fp32 product, the
reference's rounding (int8_lowering.torch_epilogue). The rowwise form (scale_a [M, 1], scale_b [1, N]) would fold
the scales into cuBLAS, but outside sm90 with cuBLAS ≥ 12.9 it writes only bf16, which would round the fp32
value the epilogue needs. No fast accumulation: cuBLAS promotes the fp8 partial sums into fp32. The tactic,
torch_scaled_mm, is registered by tactics/quant_gemm.py.
"""

from __future__ import annotations

import torch

from kiln.kinds.qtype import FP8
from kiln.tactics import int8_lowering
from kiln.tactics.spec import LayerSpec

ALIGN = 16  # _scaled_mm: K and N multiples of 16


def _round16(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def scaled_mm(a: torch.Tensor, w_t: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """A [M, K] fp8 @ w_t [K16, N16] fp8 (column-major) → fp32 [M, N16], A zero-padded to K16 when needed."""
    k, k16 = a.shape[1], w_t.shape[0]
    if k != k16:
        a = int8_lowering.pad_bytes(a, (0, k16 - k))
    elif not a.is_contiguous():
        a = a.contiguous()
    return torch._scaled_mm(a, w_t, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=False)


def compile_scaled_mm(spec: LayerSpec, config, device):
    form = int8_lowering.gemm_form(spec)
    n, k = form.w.shape
    w_t = int8_lowering.pad_bytes(form.w, (0, _round16(k) - k, 0, _round16(n) - n)).t()  # [K16, N16] column-major
    one = torch.ones((), dtype=torch.float32, device=form.w.device)
    finish = int8_lowering.torch_epilogue(spec, form)

    def run(inputs):
        return [finish(scaled_mm(form.rows(inputs[0]), w_t, one)[:, :n], inputs)]

    return run


def supports_scaled_mm(spec: LayerSpec, device) -> str | None:
    return int8_lowering.supports(spec, FP8) or int8_lowering.fp8_device_reason(device)
