"""Flash-attention forward: softmax(scale · Q Kᵀ + mask) V with an online softmax, never materializing QKᵀ.

Q (B, Hq, Sq, D), K (B, Hkv, Skv, D), V (B, Hkv, Skv, Dv); query head h reads KV head h // (Hq / Hkv)
(GQA/MQA). The mask is additive float or boolean (True: attend), broadcast over batch and heads.
Causal is top-left aligned (key j ≤ query i), as the reference without a KV cache. A query row with
no attended key gives zeros.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kiln.kernels.common import DEFAULT_SMEM, INTERPRET, dot_precision, pdl_args, pdl_start, pow2, upcast_dot
from kiln.kernels.out_buffer import take
from kiln.kernels.quantize import quantize_values

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
MASK_NONE, MASK_ADD, MASK_BOOL = 0, 1, 2
LOG2E = 1.4426950408889634  # scores kept in base 2: exp(x) = exp2(x · log2 e)
# Best first (H100, stop 36: BERT 32x512, BERT / MiniLM 64x128, ViT 64x197, b1); no num_stages=1, never faster
_SPACE = [(128, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 128, 4, 2), (128, 64, 8, 2),
          (128, 32, 4, 2), (64, 32, 4, 2), (128, 128, 8, 2), (128, 128, 8, 3), (32, 64, 4, 2), (32, 32, 2, 3),
          (32, 32, 2, 2)]


@triton.jit
def _flash_kernel(q, k, v, mask, o, H, GROUPS, Sq, Skv, D, DV, qk_scale, q_scale, mask_fill,
                  s_qb, s_qh, s_qm, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                  s_mb, s_mh, s_mm, s_mn, s_ob, s_oh, s_om, s_od,
                  MASK: tl.constexpr, MASK_ROWS: tl.constexpr, EVEN_N: tl.constexpr, CAUSAL: tl.constexpr,
                  PRECISION: tl.constexpr, UPCAST: tl.constexpr, QUANT: tl.constexpr, EXACT_DIV: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  PDL: tl.constexpr):
    """One BLOCK_M tile of query rows of one (batch, head); scores in base 2 (qk_scale holds log2 e), so
    exp2 replaces exp. EVEN_N: Skv is a multiple of BLOCK_N (no key bounds); MASK_ROWS: the mask varies
    along query rows (else one mask vector per key tile, as a key-padding mask); QUANT: o gets the output, rounded
    to Q's dtype, quantized to int8 with q_scale (as a QuantizeLinear reading it computes it)."""
    pdl_start(PDL)
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = h // GROUPS
    rm = start_m + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    cols = tl.arange(0, BLOCK_N)
    q_rows = rm < Sq
    qt = tl.load(q + b * s_qb + h * s_qh + rm[:, None] * s_qm + rd[None, :] * s_qd,
                 mask=q_rows[:, None] & (rd < D)[None, :], other=0.0)
    if UPCAST:
        qt = qt.to(tl.float32)
    k += b * s_kb + hk * s_kh
    v += b * s_vb + hk * s_vh
    mask += b * s_mb + h * s_mh

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    end = Skv
    if CAUSAL:
        end = tl.minimum(Skv, start_m + BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        rn = start_n + cols
        keys = rn < Skv
        if EVEN_N:
            kt = tl.load(k + rn[None, :] * s_kn + rd[:, None] * s_kd, mask=(rd < D)[:, None], other=0.0)
        else:
            kt = tl.load(k + rn[None, :] * s_kn + rd[:, None] * s_kd, mask=keys[None, :] & (rd < D)[:, None],
                         other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(qt, kt, input_precision=PRECISION) * qk_scale
        if MASK != 0:
            if MASK_ROWS:
                mt = tl.load(mask + rm[:, None] * s_mm + rn[None, :] * s_mn, mask=q_rows[:, None] & keys[None, :],
                             other=0)
            else:
                mt = tl.load(mask + rn * s_mn, mask=keys, other=0)[None, :]
            if MASK == 1:
                s += mt.to(tl.float32) * 1.4426950408889634
            else:  # a keep mask: a zero adds mask_fill (-inf, or an additive mask's low value: the same sum)
                s = tl.where(mt != 0, s, s + mask_fill * 1.4426950408889634)
        if CAUSAL:
            s = tl.where(rn[None, :] <= rm[:, None], s, float("-inf"))
        if not EVEN_N:
            s = tl.where(keys[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing attended yet: keep sums at 0
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if EVEN_N:
            vt = tl.load(v + rn[:, None] * s_vn + rdv[None, :] * s_vd, mask=(rdv < DV)[None, :], other=0.0)
        else:
            vt = tl.load(v + rn[:, None] * s_vn + rdv[None, :] * s_vd, mask=keys[:, None] & (rdv < DV)[None, :],
                         other=0.0)
        if UPCAST:
            vt = vt.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        m_i = m_new
    out = (acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]).to(q.dtype.element_ty)
    if QUANT:
        out = quantize_values(out, q_scale, False, EXACT_DIV)
    tl.store(o + b * s_ob + h * s_oh + rm[:, None] * s_om + rdv[None, :] * s_od, out.to(o.dtype.element_ty),
             mask=q_rows[:, None] & (rdv < DV)[None, :])


def smem_bytes(cfg: dict, d: int, dv: int, itemsize: int) -> int:
    """Shared memory of a config: the Q tile plus num_stages buffered K and V tiles."""
    bd, bdv = pow2(d, 16, 256), pow2(dv, 16, 256)
    return (cfg["BLOCK_M"] * bd + cfg["num_stages"] * cfg["BLOCK_N"] * (bd + bdv)) * itemsize


def configs(sq: int | None, d: int, dv: int, itemsize: int, smem: int, level: int) -> list[dict]:
    """Best-first tile configs that fit `smem`; one (the first that fits) at levels 0–1."""
    out = []
    for t in _SPACE:
        cfg = dict(zip(CONFIG_KEYS, t))
        if max(d, dv) > 64 and cfg["BLOCK_M"] * cfg["BLOCK_N"] > 128 * 64:
            continue  # large head dims: the big tiles spill registers
        if sq is not None and cfg["BLOCK_M"] > pow2(sq, 32, 128):
            continue
        if smem_bytes(cfg, d, dv, itemsize) <= smem:
            out.append(cfg)
    out = out or [{"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 2, "num_stages": 1}]
    return out[:1] if level <= 1 else out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
              causal: bool = False, scale: float | None = None, config: dict | None = None,
              tf32: bool = False, heads_inner: bool = False, q_scale: float | None = None,
              mask_fill: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ + mask) v for (B, H, S, D) tensors of any strides; the result has q's dtype (int8, the
    per-tensor QuantizeLinear of that, with `q_scale`) and shape (B, Hq, Sq, Dv), laid out as (B, Sq, Hq, Dv) when
    `heads_inner` (heads merged back by a view); in `out`'s bytes when given. A bool or integer mask keeps the keys
    where it is not zero and adds `mask_fill` (None: -inf) to the others' scores."""
    bsz, hq, sq, d = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    cfg = config or configs(sq, d, dv, q.element_size(), DEFAULT_SMEM, 0)[0]
    dtype = torch.int8 if q_scale is not None else q.dtype
    if heads_inner:
        o = take(out, (bsz, sq, hq, dv), dtype, q.device).transpose(1, 2)
    else:
        o = take(out, (bsz, hq, sq, dv), dtype, q.device)
    if o.numel() == 0:
        return o
    kind = MASK_NONE if mask is None else MASK_ADD if mask.dtype.is_floating_point else MASK_BOOL  # bool / int: keep
    m = mask.expand(bsz, hq, sq, skv) if mask is not None else o
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    grid = (triton.cdiv(sq, cfg["BLOCK_M"]), bsz * hq)
    _flash_kernel[grid](q, k, v, m, o, hq, hq // hkv, sq, skv, d, dv, float(scale) * LOG2E, float(q_scale or 1.0),
                        -math.inf if mask_fill is None else float(mask_fill),
                        *q.stride(), *k.stride(), *v.stride(), *m.stride(), *o.stride(),
                        MASK=kind, MASK_ROWS=mask is not None and sq > 1 and m.stride(2) != 0,
                        EVEN_N=skv % cfg["BLOCK_N"] == 0, CAUSAL=causal, PRECISION=dot_precision(q.dtype, tf32),
                        UPCAST=upcast_dot(q.dtype), QUANT=q_scale is not None, EXACT_DIV=not INTERPRET,
                        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=pow2(d, 16, 256),
                        BLOCK_DV=pow2(dv, 16, 256), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                        **pdl_args(q.device))
    return o
