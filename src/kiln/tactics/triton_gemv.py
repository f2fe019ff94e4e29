"""Gemm, MatMul and FusedGemm of a few rows (a classifier or pooler at batch 1) through the Triton GEMV
(kernels/gemv.py): a constant right operand kept [N, K], bias or C of one row, alpha/beta and the activation fused."""

from __future__ import annotations

import math

from kiln.kernels import gemv
from kiln.tactics.common import first, rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import FUSED_ACTS, epilogue, io_reason, rows


def _transposed(spec: LayerSpec) -> bool:
    """Whether the constant right operand is stored [N, K] (Gemm's transB, FusedGemm's trans_b)."""
    return bool(spec.attrs.get("transB") or spec.attrs.get("trans_b"))


def _reason(spec: LayerSpec, device) -> str | None:
    w, x = spec.inputs[1], spec.inputs[0]
    if w is None or w.const is None or w.const.dim() != 2:
        return "right operand is not a constant 2-D matrix"
    m = rows(x) if spec.kind != "Gemm" else (x.shape[1 if spec.attrs.get("transA") else 0] if x.shape else None)
    if not isinstance(m, int) or m > gemv.MAX_ROWS:
        return f"more than {gemv.MAX_ROWS} rows (or a row count unknown at build): a GEMM's job"
    if spec.kind == "Gemm" and rank(x) != 2:
        return "A must be 2-D"
    if spec.attrs.get("activation", "none") not in FUSED_ACTS:
        return f"activation {spec.attrs['activation']!r} has no Triton epilogue"
    c = spec.inputs[2] if len(spec.inputs) > 2 else None
    n = w.const.shape[0 if _transposed(spec) else 1]
    if c is not None and (not c.shape or math.prod(c.shape) != n or c.shape[-1] != n):
        return "bias / C is not one row of the output's columns"
    return io_reason(spec, [v for v in (*spec.inputs, spec.outputs[0]) if v is not None], device)


def _configs(spec: LayerSpec, device, level: int):
    n, k = spec.inputs[1].const.shape if _transposed(spec) else spec.inputs[1].const.shape[::-1]
    return gemv.configs(n, k, level)


def _compile(spec: LayerSpec, config, device):
    a = spec.attrs
    b = spec.inputs[1].const
    w = (b if _transposed(spec) else b.t()).contiguous()  # [N, K]
    n = w.shape[0]
    act, act_alpha, act_beta = epilogue(a)
    alpha, beta, trans_a = a.get("alpha", 1.0), a.get("beta", 1.0), a.get("transA", 0)
    tiles = {k: config[k] for k in gemv.CONFIG_KEYS}

    def run(inputs, out=None):
        x = inputs[0].t() if trans_a else inputs[0]
        c = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        y = gemv.gemv(x.reshape(-1, x.shape[-1]), w, None if c is None else c.reshape(n), alpha=alpha, beta=beta,
                      activation=act, act_alpha=act_alpha, act_beta=act_beta, config=tiles, out=first(out))
        return [y.reshape(*x.shape[:-1], n)]

    return run


register(Tactic("triton_gemv", ("Gemm", "MatMul", "FusedGemm"), _compile, _reason, _configs, priority=25,
                writes_out=True))
