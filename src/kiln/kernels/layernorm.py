"""LayerNorm over the last dim (and residual add + LayerNorm, and embedding lookups summed + LayerNorm): one program
per row, statistics in fp32.

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

MAX_TERMS = 3  # table lookups an embedding LayerNorm sums


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


@triton.jit
def _lookup(ids, table, rows, period, V, cols, inside, N):
    """Table rows at each row's index (index tensor repeating every `period` rows; negative indices count from the
    end, others outside [0, V) read zeros), [ROWS, BLOCK]."""
    i = tl.load(ids + rows % period).to(tl.int64)
    i = tl.where(i < 0, i + V, i)
    ok = inside & ((i >= 0) & (i < V))[:, None]
    return tl.load(table + i[:, None] * N + cols[None, :], mask=ok, other=0.0)


@triton.jit
def _embed_layernorm_kernel(i0, t0, i1, t1, i2, t2, c, w, b, y, M, N, p0, p1, p2, pc, v0, v1, v2, eps,
                            TERMS: tl.constexpr, HAS_CONST: tl.constexpr, HAS_BIAS: tl.constexpr,
                            BLOCK: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    """ROWS rows a program: TERMS table lookups and the constant rows summed left to right, each sum rounded to
    y's dtype as the unfused Adds give it, then normalized."""
    pdl_start(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    inside = (rows < M)[:, None] & (cols < N)[None, :]
    rows = tl.where(rows < M, rows, 0)
    v = _lookup(i0, t0, rows, p0, v0, cols, inside, N)
    if TERMS > 1:
        v = (v.to(tl.float32) + _lookup(i1, t1, rows, p1, v1, cols, inside, N).to(tl.float32)).to(y.dtype.element_ty)
    if TERMS > 2:
        v = (v.to(tl.float32) + _lookup(i2, t2, rows, p2, v2, cols, inside, N).to(tl.float32)).to(y.dtype.element_ty)
    if HAS_CONST:
        rc = (rows % pc)[:, None] * N + cols[None, :]
        v = (v.to(tl.float32) + tl.load(c + rc, mask=inside, other=0.0).to(tl.float32)).to(y.dtype.element_ty)
    out = _normalize_rows(v.to(tl.float32), inside, w, b, cols, N, eps, HAS_BIAS)
    tl.store(y + rows[:, None] * N + cols[None, :], out.to(y.dtype.element_ty), mask=inside)


def embed_layer_norm(terms: list[tuple[torch.Tensor, torch.Tensor]], const: torch.Tensor | None,
                     weight: torch.Tensor, bias: torch.Tensor | None, eps: float, config: dict | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm over the last dim of ((T0[I0] + T1[I1]) + T2[I2]) + C: `terms` (index tensor, [V, N] table) of up to
    MAX_TERMS lookups and an optional constant whose rows repeat over the leading dims, as do the index tensors
    (each, leading 1s dropped, the output's trailing dims); in `out`'s bytes when given."""
    if not 1 <= len(terms) <= MAX_TERMS:
        raise ValueError(f"1 to {MAX_TERMS} lookups, not {len(terms)}")
    n = terms[0][1].shape[1]
    parts = [ids.shape for ids, _ in terms] + ([const.shape[:-1]] if const is not None else [])
    lead = torch.broadcast_shapes(*parts)
    for part in parts:
        trimmed = tuple(part)[next((i for i, d in enumerate(part) if d != 1), len(part)):]
        if tuple(lead)[len(lead) - len(trimmed):] != trimmed:
            raise ValueError(f"a lookup or constant of leading shape {list(part)} does not repeat over {list(lead)}")
    cfg = config or row_config(n)
    if n > cfg["BLOCK"]:
        raise ValueError(f"rows of {n} values do not fit one block of {cfg['BLOCK']}")
    table = terms[0][1]
    y = take(out, (*lead, n), table.dtype, table.device)
    m = y.numel() // n if n else 0
    if m == 0:
        return y
    padded = terms + [terms[0]] * (MAX_TERMS - len(terms))
    ids = [i.contiguous() for i, _ in padded]
    tables = [t.contiguous() for _, t in padded]
    c = const.contiguous() if const is not None else y
    rows = cfg.get("ROWS", 1)
    _embed_layernorm_kernel[(triton.cdiv(m, rows),)](
        ids[0], tables[0], ids[1], tables[1], ids[2], tables[2], c, weight.reshape(-1),
        bias.reshape(-1) if bias is not None else weight.reshape(-1), y, m, n,
        *(max(1, i.numel()) for i in ids), max(1, c.numel() // n) if const is not None else 1,
        *(t.shape[0] for t in tables), float(eps), TERMS=len(terms), HAS_CONST=const is not None,
        HAS_BIAS=bias is not None, BLOCK=cfg["BLOCK"], ROWS=rows, num_warps=cfg["num_warps"], **pdl_args(y.device))
    return y
