"""LayerNorm over the last dim (and residual add + LayerNorm): one program per row, statistics in fp32.

A row that fits one block (N ≤ BLOCK) is read once and kept in registers; wider rows are walked in
BLOCK-wide chunks three times (mean, variance, normalize) so that any width runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import INTERPRET, pdl_args, pdl_start, row_config
from kiln.kernels.quantize import quantize_values
from kiln.kernels.out_buffer import take



@triton.jit
def _normalize_row(v, inside, w, b, cols, N, eps, HAS_BIAS: tl.constexpr):
    """One row held in registers (fp32, zeros outside `inside`), normalized, scaled by w and shifted by b."""
    mean = tl.sum(v, 0) / N
    d = tl.where(inside, v - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N + eps)
    out = d * rstd * tl.load(w + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_BIAS:
        out += tl.load(b + cols, mask=inside, other=0.0).to(tl.float32)
    return out


@triton.jit
def _layernorm_kernel(x, w, b, y, N, s_x, s_y, eps, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
                      ONE_PASS: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    x += row * s_x
    y += row * s_y
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        inside = cols < N
        v = tl.load(x + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(y + cols, _normalize_row(v, inside, w, b, cols, N, eps, HAS_BIAS).to(y.dtype.element_ty),
                 mask=inside)
    else:
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, N, BLOCK):
            total += tl.load(x + start + cols, mask=start + cols < N, other=0.0).to(tl.float32)
        mean = tl.sum(total, 0) / N
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, N, BLOCK):
            inside = start + cols < N
            d = tl.where(inside, tl.load(x + start + cols, mask=inside, other=0.0).to(tl.float32) - mean, 0.0)
            total += d * d
        rstd = 1.0 / tl.sqrt(tl.sum(total, 0) / N + eps)
        for start in range(0, N, BLOCK):
            inside = start + cols < N
            v = tl.load(x + start + cols, mask=inside, other=0.0).to(tl.float32)
            out = (v - mean) * rstd * tl.load(w + start + cols, mask=inside, other=0.0).to(tl.float32)
            if HAS_BIAS:
                out += tl.load(b + start + cols, mask=inside, other=0.0).to(tl.float32)
            tl.store(y + start + cols, out.to(y.dtype.element_ty), mask=inside)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
               config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm of x over its last dim; weight and bias hold the last dim's N values; in `out`'s bytes when given."""
    n = x.shape[-1]
    cfg = config or row_config(n)
    x2 = x.reshape(-1, n)
    if x2.numel() and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = take(out, x.shape, x.dtype, x.device)
    if x2.numel() == 0:
        return y
    w = weight.reshape(-1)
    b = bias.reshape(-1) if bias is not None else w
    _layernorm_kernel[(x2.shape[0],)](x2, w, b, y, n, x2.stride(0), n, float(eps), HAS_BIAS=bias is not None,
                                      BLOCK=cfg["BLOCK"], ONE_PASS=n <= cfg["BLOCK"], num_warps=cfg["num_warps"],
                                      **pdl_args(x.device))
    return y


@triton.jit
def _normalize_rows(v, inside, w, b, cols, N, eps, HAS_BIAS: tl.constexpr):
    """_normalize_row for a [ROWS, BLOCK] tile: each row's statistics over axis 1."""
    mean = tl.sum(v, 1) / N
    d = tl.where(inside, v - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, 1) / N + eps)
    c_ok = cols < N
    out = d * rstd[:, None] * tl.load(w + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        out += tl.load(b + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    return out


@triton.jit
def _add_layernorm_kernel(a, r, w, b, y, s, q, qm, M, N, s_a, s_r, eps, q_scale, HAS_BIAS: tl.constexpr,
                          STORE_SUM: tl.constexpr, QUANT: tl.constexpr, Q_MUL: tl.constexpr, FP8: tl.constexpr,
                          EXACT_DIV: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    """ROWS rows a program: more bytes in flight than one row's (faster for BERT's 768-wide fp16 rows)."""
    pdl_start(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    inside = (rows < M)[:, None] & (cols < N)[None, :]
    v = tl.load(a + rows[:, None] * s_a + cols[None, :], mask=inside, other=0.0).to(tl.float32)
    v += tl.load(r + rows[:, None] * s_r + cols[None, :], mask=inside, other=0.0).to(tl.float32)
    v = v.to(y.dtype.element_ty)  # the sum is rounded to the tensors' dtype, as the unfused Add gives it
    at = rows[:, None] * N + cols[None, :]
    if STORE_SUM:
        tl.store(s + at, v, mask=inside)
    out = _normalize_rows(v.to(tl.float32), inside, w, b, cols, N, eps, HAS_BIAS).to(y.dtype.element_ty)
    tl.store(y + at, out, mask=inside)
    if QUANT:  # the stored value quantized, as a QuantizeLinear reading y (or y · qm, rounded as y) computes it
        if Q_MUL:
            out = (out.to(tl.float32) * tl.load(qm + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]).to(
                y.dtype.element_ty)
        tl.store(q + at, quantize_values(out, q_scale, FP8, EXACT_DIV).to(q.dtype.element_ty), mask=inside)


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    x2 = x.reshape(-1, n)
    return x2.contiguous() if x2.numel() and x2.stride(-1) != 1 else x2


def add_layer_norm(a: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                   config: dict | None = None, want_sum: bool = True, out: tuple = (None, None, None),
                   q_scale: float | None = None, q_dtype: torch.dtype = torch.int8,
                   q_mul: torch.Tensor | None = None) -> tuple:
    """(LayerNorm(a + r) over the last dim, a + r) in one pass, config's ROWS rows a program (default 1); a and r
    have one shape, rows of ≤ BLOCK values.
    The sum is None when not `want_sum`; with `q_scale` a third result, the normalized rows (times `q_mul` per
    column, if given) quantized to q_dtype (kernels/quantize.py's arithmetic); `out` holds byte buffers for the
    results (or None)."""
    n = a.shape[-1]
    cfg = config or row_config(n)
    if n > cfg["BLOCK"]:
        raise ValueError(f"rows of {n} values do not fit one block of {cfg['BLOCK']}")
    a2, r2 = _rows(a, n), _rows(r, n)
    out = (list(out) + [None] * 3)[:3]
    y = take(out[0], a.shape, a.dtype, a.device)
    s = take(out[1], a.shape, a.dtype, a.device) if want_sum else None
    q = take(out[2], a.shape, q_dtype, a.device) if q_scale is not None else None
    if a2.numel():
        w = weight.reshape(-1)
        b = bias.reshape(-1) if bias is not None else w
        qm = q_mul.reshape(-1) if q_mul is not None and q is not None else w
        rows = cfg.get("ROWS", 1)
        _add_layernorm_kernel[(triton.cdiv(a2.shape[0], rows),)](
            a2, r2, w, b, y, s if s is not None else y, q if q is not None else y, qm, a2.shape[0], n, a2.stride(0),
            r2.stride(0), float(eps), float(q_scale or 1.0), HAS_BIAS=bias is not None, STORE_SUM=want_sum,
            QUANT=q is not None, Q_MUL=qm is not w, FP8=q_dtype == torch.float8_e4m3fn, EXACT_DIV=not INTERPRET,
            BLOCK=cfg["BLOCK"], ROWS=rows, num_warps=cfg["num_warps"], **pdl_args(a.device))
    return (y, s) if q is None else (y, s, q)
