"""GEMM with a fused epilogue: C = act(alpha · A @ W + beta · bias), fp32 accumulation, any strides.

A is (M, K), W is (K, N), bias broadcasts to (M, N). Tiles are swizzled in groups of GROUP_M rows of
tiles so that neighbouring programs share W tiles in L2. Configs are pruned by the tile's shared memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import (ACTIVATIONS, DEFAULT_SMEM, SplitScratch, activate, dot_precision, grouped_tile,
                                 pdl_args, pdl_start, pow2, split_k_configs, split_k_plan, split_k_sum, upcast_dot)
from kiln.kernels.out_buffer import take

TILES_WANTED = 64  # the default config shrinks tiles until a problem has this many (enough to fill most GPUs)
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")

# Tile shapes known to do well on Ampere/Hopper (the triton matmul tutorial's list plus small-M tiles),
# best-first; the device's shared memory and the problem size prune them.
_SPACE = [
    (128, 128, 64, 8, 8, 3), (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3), (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4), (64, 128, 32, 8, 4, 4), (64, 256, 32, 8, 4, 4), (128, 64, 64, 8, 4, 3),
    (64, 128, 64, 8, 4, 3), (64, 64, 64, 8, 4, 3), (128, 32, 32, 8, 4, 4), (64, 32, 32, 8, 2, 5),
    (32, 64, 32, 8, 2, 5), (64, 64, 32, 8, 4, 4), (32, 128, 64, 8, 4, 3), (16, 128, 64, 8, 4, 3),
    (16, 64, 128, 8, 4, 3), (32, 32, 128, 8, 4, 3), (16, 32, 64, 8, 2, 4), (128, 128, 64, 8, 8, 4),
]


@triton.jit
def _gemm_kernel(a, w, bias, c, M, N, K, alpha, beta, act_alpha, act_beta,
                 s_am, s_ak, s_wk, s_wn, s_bm, s_bn, s_cm, s_cn, ws, counts, k_per,
                 HAS_BIAS: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 SPLIT: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = tl.program_id(2) * k_per  # split-K (grid axis 2): this program's run of K (all of K unsplit)
    k_len = tl.minimum(K - k_lo, k_per)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a + (rm % M)[:, None] * s_am + (k_lo + rk)[None, :] * s_ak  # wrapped rows/cols: loads stay in bounds
    w_ptrs = w + (k_lo + rk)[:, None] * s_wk + (rn % N)[None, :] * s_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(k_len, BLOCK_K)):
        k_left = k_len - kb * BLOCK_K
        x = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        y = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
            y = y.to(tl.float32)
        acc += tl.dot(x, y, input_precision=PRECISION)
        a_ptrs += BLOCK_K * s_ak
        w_ptrs += BLOCK_K * s_wk

    inside = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT:  # the tile's last split to finish sums them all and alone runs the epilogue
        acc, last = split_k_sum(acc, ws, counts, BLOCK_M, BLOCK_N)
        inside = inside & last
    acc = acc * alpha
    if HAS_BIAS:
        b = tl.load(bias + rm[:, None] * s_bm + rn[None, :] * s_bn, mask=inside, other=0.0)
        acc += beta * b.to(tl.float32)
    acc = activate(acc, ACT, act_alpha, act_beta)
    tl.store(c + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c.dtype.element_ty), mask=inside)


def smem_bytes(cfg: dict, itemsize: int) -> int:
    """Shared memory of a config: num_stages buffered A and W tiles."""
    return cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * itemsize


def _fit(cfg: dict, itemsize: int, smem: int, min_k: int) -> dict:
    """cfg with fewer pipeline stages (down to 2), then a shorter BLOCK_K (down to min_k), until it fits smem."""
    cfg = dict(cfg)
    while smem_bytes(cfg, itemsize) > smem and cfg["num_stages"] > 2:
        cfg["num_stages"] -= 1
    while smem_bytes(cfg, itemsize) > smem and cfg["BLOCK_K"] > min_k:
        cfg["BLOCK_K"] //= 2
    return cfg


def default_config(m: int | None, n: int, k: int, itemsize: int, smem: int) -> dict:
    """One good config for an (M, N, K) problem without timing: tiles no larger than the problem."""
    bm = pow2(m or 128, 16, 128)
    bn = pow2(n, 16, 128)
    while triton.cdiv(m or 4096, bm) * triton.cdiv(n, bn) < TILES_WANTED and max(bm, bn) > 32:
        bm, bn = (bm // 2, bn) if bm >= bn else (bm, bn // 2)  # small problems: more, smaller tiles
    bk = pow2(k, 16, 64 if itemsize <= 2 else 32)
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
           "num_warps": 8 if bm * bn >= 128 * 128 else 4, "num_stages": 4}
    return _fit(cfg, itemsize, smem, 16)


def configs(m: int | None, n: int, k: int, itemsize: int, smem: int, level: int, sms: int = 0) -> list[dict]:
    """The default config, then (level ≥ 2) every tile of the space that fits `smem` (with fewer stages if
    need be) and is no larger than the problem, and split-K variants, after the first three, where the tiles fill
    under half of `sms` multiprocessors (`split_k_configs`)."""
    first = default_config(m, n, k, itemsize, smem)
    if level <= 1:
        return [first]
    out = [first]
    for t in _SPACE:
        cfg = _fit(dict(zip(CONFIG_KEYS, t)), itemsize, smem, t[2])
        too_big = (cfg["BLOCK_M"] > pow2(m or 128, 16, 256) or cfg["BLOCK_N"] > pow2(n, 16, 256)
                   or cfg["BLOCK_K"] > pow2(k, 16, 128))
        if not too_big and smem_bytes(cfg, itemsize) <= smem and cfg not in out:
            out.append(cfg)
    split = [c for c in (split_k_configs(out, m, n, k, sms) if m else []) if smem_bytes(c, itemsize) <= smem]
    return out[:3] + split + out[3:]  # few rows: the split configs within the autotuner's first few


def matmul(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, alpha: float = 1.0,
           beta: float = 1.0, activation: str = "none", act_alpha: float = 1.0, act_beta: float = 0.0,
           config: dict | None = None, tf32: bool = False, out: torch.Tensor | None = None,
           scratch: SplitScratch | None = None) -> torch.Tensor:
    """act(alpha · a @ w + beta · bias) in a's dtype; a (M, K), w (K, N), bias broadcastable to (M, N);
    written into `out`'s bytes when given. A config's SPLIT_K needs `scratch` (the caller's, kept while its kernel
    lives); it is dropped where the grid already fills the GPU."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    (m, k), n = a.shape, w.shape[1]
    cfg = config or default_config(m, n, k, a.element_size(), DEFAULT_SMEM)
    c = take(out, (m, n), a.dtype, a.device)
    if m == 0 or n == 0:
        return c
    b = bias.expand(m, n) if bias is not None else c
    tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
    per, splits, ws, counts = split_k_plan(cfg, triton.cdiv(k, cfg["BLOCK_K"]), tiles, a.device, scratch, c)
    _gemm_kernel[(tiles, 1, splits)](
        a, w, b, c, m, n, k, float(alpha), float(beta), float(act_alpha), float(act_beta),
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        ws, counts, per * cfg["BLOCK_K"], HAS_BIAS=bias is not None, ACT=activation,
        PRECISION=dot_precision(a.dtype, tf32), UPCAST=upcast_dot(a.dtype), SPLIT=splits > 1,
        **{key: cfg[key] for key in CONFIG_KEYS}, **pdl_args(a.device))
    return c
