"""Softmax over the last dim: one program per row, in fp32.

A row that fits one block is read once; wider rows take an online pass (running max and rescaled
sum per lane) and a normalizing pass, BLOCK values at a time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import pdl_args, pdl_start, row_config
from kiln.kernels.out_buffer import take



@triton.jit
def _softmax_kernel(x, y, N, s_x, s_y, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    x += row * s_x
    y += row * s_y
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        inside = cols < N
        v = tl.load(x + cols, mask=inside, other=float("-inf")).to(tl.float32)
        e = tl.exp(v - tl.max(v, 0))
        tl.store(y + cols, (e / tl.sum(e, 0)).to(y.dtype.element_ty), mask=inside)
    else:
        m = tl.full((BLOCK,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, N, BLOCK):
            v = tl.load(x + start + cols, mask=start + cols < N, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, v)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a lane still all -inf adds nothing
            s = s * tl.exp(m - m_safe) + tl.exp(v - m_safe)
            m = m_new
        row_max = tl.max(m, 0)
        safe = tl.where(row_max == float("-inf"), 0.0, row_max)
        total = tl.sum(s * tl.exp(m - safe), 0)
        for start in range(0, N, BLOCK):
            inside = start + cols < N
            v = tl.load(x + start + cols, mask=inside, other=float("-inf")).to(tl.float32)
            tl.store(y + start + cols, (tl.exp(v - row_max) / total).to(y.dtype.element_ty), mask=inside)


def softmax(x: torch.Tensor, config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax of x over its last dim, in x's dtype (computed in fp32), in `out`'s bytes when given."""
    n = x.shape[-1] if x.dim() else 1
    cfg = config or row_config(n)
    x2 = x.reshape(-1, n)
    if x2.numel() and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = take(out, x.shape, x.dtype, x.device)
    if x2.numel() == 0:
        return y
    _softmax_kernel[(x2.shape[0],)](x2, y, n, x2.stride(0), n, BLOCK=cfg["BLOCK"], ONE_PASS=n <= cfg["BLOCK"],
                                    num_warps=cfg["num_warps"], **pdl_args(x.device))
    return y
