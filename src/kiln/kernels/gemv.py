"""y = act(alpha · x @ W + beta · c) for a few rows of x (M ≤ MAX_ROWS: a classifier or pooler at batch 1), where a
GEMM's tiles are mostly empty rows and the layer is bound by reading W once.

W is kept [N, K], K contiguous: each program takes BLOCK_N output columns of one row and streams their weights in
BLOCK_K chunks (one chunk for K ≤ BLOCK_K: every load of the program in flight at once), multiplying and summing
along K on CUDA cores in fp32. A row of x is re-read by every program from L2; W once per row of x.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import ACTIVATIONS, activate, pdl_args, pdl_start, pow2, tile_configs
from kiln.kernels.out_buffer import take

MAX_ROWS = 8
CONFIG_KEYS = ("BLOCK_N", "BLOCK_K", "num_warps")
# best-first: few columns a program (many programs for N ≈ 1000) and a long K chunk (few dependent load rounds)
_SPACE = [(8, 1024, 4), (4, 2048, 4), (16, 512, 4), (8, 2048, 8), (4, 1024, 2), (16, 1024, 8), (32, 256, 4),
          (2, 2048, 2)]
PER_LEVEL = {0: 1, 1: 2, 2: 3, 3: 4}  # configs offered per opt level; all from level 4


@triton.jit
def _gemv_kernel(x, w, c, y, N, K, s_xm, s_xk, s_ym, alpha, beta, act_alpha, act_beta, HAS_C: tl.constexpr,
                 ACT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    m = tl.program_id(1)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        a = tl.load(x + m * s_xm + rk * s_xk, mask=k_ok, other=0.0).to(tl.float32)
        b = tl.load(w + rn[:, None] * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(b.to(tl.float32) * a[None, :], axis=1)
    acc = acc * alpha
    if HAS_C:
        acc += beta * tl.load(c + rn, mask=n_ok, other=0.0).to(tl.float32)
    acc = activate(acc, ACT, act_alpha, act_beta)
    tl.store(y + m * s_ym + rn, acc.to(y.dtype.element_ty), mask=n_ok)


def configs(n: int, k: int, level: int) -> list[dict]:
    """Tiles no larger than the problem (N columns, K reduction), best-first; fewer at low levels."""
    limits = {"BLOCK_N": pow2(n, 2, 32), "BLOCK_K": pow2(k, 16, 2048)}
    return tile_configs(_SPACE, CONFIG_KEYS, limits, {"BLOCK_N": 2, "BLOCK_K": 16, "num_warps": 1}, PER_LEVEL, level)


def gemv(x: torch.Tensor, w_nk: torch.Tensor, c: torch.Tensor | None = None, *, alpha: float = 1.0,
         beta: float = 1.0, activation: str = "none", act_alpha: float = 1.0, act_beta: float = 0.0,
         config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """act(alpha · x @ w_nkᵀ + beta · c) as an [M, N] tensor in x's dtype (in `out`'s bytes when given). x [M, K]
    (any strides, M ≤ MAX_ROWS), w_nk [N, K] contiguous, c [N] or None."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    (m, k), n = x.shape, w_nk.shape[0]
    if m > MAX_ROWS or w_nk.shape[1] != k or not w_nk.is_contiguous():
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows and a contiguous [N, K] weight")
    y = take(out, (m, n), x.dtype, x.device)
    if y.numel() == 0:
        return y
    cfg = config or configs(n, k, 1)[0]
    _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]), m)](
        x, w_nk, c if c is not None else y, y, n, k, x.stride(0), x.stride(1), y.stride(0), float(alpha), float(beta),
        float(act_alpha), float(act_beta), HAS_C=c is not None, ACT=activation, BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], **pdl_args(x.device))
    return y
