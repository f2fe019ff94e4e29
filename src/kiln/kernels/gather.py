"""Gather along one axis in one kernel: Y[o, j, :] = X[o, wrap(I[j]), :], X seen as (outer, size, inner).

The reference wraps negative indices with three elementwise kernels before its index_select (four launches a
Gather: BERT's embedding lookups and mask gather, ~2 µs each at batch 1); here each program wraps its own
indices. An index outside [-size, size) reads zeros instead of faulting the device.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kiln.kernels.common import pdl_args, pdl_start, pow2
from kiln.kernels.out_buffer import take


@triton.jit
def _gather_kernel(x, idx, y, n_idx, size, inner, tiles_j, BLOCK_J: tl.constexpr, BLOCK_I: tl.constexpr,
                   PDL: tl.constexpr):
    pdl_start(PDL)
    o = (tl.program_id(0) // tiles_j).to(tl.int64)
    rj = (tl.program_id(0) % tiles_j) * BLOCK_J + tl.arange(0, BLOCK_J)
    ri = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    j_ok, i_ok = rj < n_idx, ri < inner
    i = tl.load(idx + rj, mask=j_ok, other=0).to(tl.int64)
    i = tl.where(i < 0, i + size, i)
    found = j_ok & (i >= 0) & (i < size)
    v = tl.load(x + (o * size + i)[:, None] * inner + ri[None, :], mask=found[:, None] & i_ok[None, :], other=0)
    tl.store(y + (o * n_idx + rj)[:, None].to(tl.int64) * inner + ri[None, :], v, mask=j_ok[:, None] & i_ok[None, :])


def block_sizes(n_idx: int, inner: int) -> tuple[int, int]:
    """(indices, elements of a row) a program copies: whole rows up to 1024 elements, about 2048 elements a program."""
    block_i = pow2(inner, 1, 1024)
    return pow2(min(n_idx, max(1, 2048 // block_i)), 1, 2048), block_i


def gather(x: torch.Tensor, idx: torch.Tensor, axis: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """X gathered at integer indices `idx` along `axis` (≥ 0), as ONNX Gather (negative indices count from the
    end); written into `out`'s bytes when given."""
    size = x.shape[axis]
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    y = take(out, (*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]), x.dtype, x.device)
    n_idx = idx.numel()
    if y.numel() == 0:
        return y
    block_j, block_i = block_sizes(n_idx, inner)
    tiles_j = triton.cdiv(n_idx, block_j)
    _gather_kernel[(outer * tiles_j, triton.cdiv(inner, block_i))](
        x.contiguous(), idx.contiguous(), y, n_idx, size, inner, tiles_j, BLOCK_J=block_j, BLOCK_I=block_i,
        num_warps=4, **pdl_args(x.device))
    return y
