"""QuantGemm and QuantConv through torch._int_mm (cuBLASLt int8 GEMM, int32 out), the epilogue in torch ops.

_int_mm on CUDA needs A [M, K] with M > 16 and K, N multiples of 8: the weight is zero-padded to N, K
multiples of 8 once at build time; A is zero-padded (rows to 32 when M ≤ 16, columns to K's multiple of 8)
at run time, which costs a copy only for such layers (e.g. a first conv with 3 channels). The padding
adds zeros to the integer sums, so results stay exact. The epilogue is the reference's own arithmetic
(int8_lowering.torch_epilogue). The tactic, torch_int_mm, is registered by tactics/quant_gemm.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.kinds.qtype import INT8
from kiln.tactics import int8_lowering
from kiln.tactics.spec import LayerSpec

MIN_ROWS = 17  # _int_mm needs M > 16


def _round8(n: int) -> int:
    return -(-n // 8) * 8


def int_mm(a: torch.Tensor, w_t: torch.Tensor, k: int) -> torch.Tensor:
    """A [M, K] int8 @ w_t [K8, N8] int8 → int32 [M, N8], padding A to _int_mm's shape rules."""
    m, k8 = a.shape[0], w_t.shape[0]
    if k8 != k or m < MIN_ROWS:
        a = F.pad(a, (0, k8 - k, 0, max(0, 32 - m) if m < MIN_ROWS else 0))
    return torch._int_mm(a, w_t)[:m]


def compile_int_mm(spec: LayerSpec, config, device):
    form = int8_lowering.gemm_form(spec)
    n, k = form.w.shape
    w_t = F.pad(form.w, (0, _round8(k) - k, 0, _round8(n) - n)).t()  # [K8, N8] column-major, cuBLASLt's liking
    finish = int8_lowering.torch_epilogue(spec, form)

    def run(inputs):
        return [finish(int_mm(form.rows(inputs[0]), w_t, k)[:, :n].float(), inputs)]

    return run


def supports_int_mm(spec: LayerSpec, device) -> str | None:
    return int8_lowering.supports(spec, INT8)
