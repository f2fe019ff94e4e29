"""Per-tensor QuantizeLinear to int8 or fp8 e4m3 in one pass: q = saturate(round_half_even(fp32(x) / scale)),
over [-128, 127] for int8, the e4m3 values within ±448 for fp8.

The division is IEEE fp32 (div_rn on the GPU), as the reference's fp32 division; int8 rounding uses the fp32 add
and subtract of 1.5·2²³ after clamping (exact for |v| ≤ 128, and clamp and round commute at integer bounds); fp8
rounds at the value's e4m3 step (kernels/int8_gemm.round_e4m3), so the store converts an exact value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import INTERPRET
from kiln.kernels.int8_gemm import MAGIC_BITS, ROUND_MAGIC, round_e4m3
from kiln.kernels.out_buffer import take

@triton.jit
def _div(y, s, EXACT: tl.constexpr):
    """y / s: IEEE (div_rn) on the GPU, plain under the interpreter (which has no div_rn)."""
    if EXACT:
        return tl.math.div_rn(y, s)
    return y / s


CONFIGS = [{"BLOCK": 2048, "num_warps": 4}, {"BLOCK": 4096, "num_warps": 8}, {"BLOCK": 1024, "num_warps": 4}]


@triton.jit
def quantize_values(x, scale, FP8: tl.constexpr, EXACT_DIV: tl.constexpr):
    """A float tile → its quantized values (module docstring): fp32 exact in e4m3, or the int8 integer as int32."""
    v = _div(x.to(tl.float32), scale, EXACT_DIV)
    if FP8:
        v = round_e4m3(v)
    else:
        v = tl.minimum(tl.maximum(v, -128.0), 127.0)
        v = (v + ROUND_MAGIC).to(tl.int32, bitcast=True) - MAGIC_BITS  # the rounded integer, from the bits
    return v


@triton.jit
def _quantize_kernel(x, q, n, scale, FP8: tl.constexpr, EXACT_DIV: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    v = quantize_values(tl.load(x + offs, mask=inside, other=0.0), scale, FP8, EXACT_DIV)
    tl.store(q + offs, v.to(q.dtype.element_ty), mask=inside)


def quantize(x: torch.Tensor, scale: float, config: dict | None = None,
             dtype: torch.dtype = torch.int8, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (fp32/fp16/bf16) as `dtype` (int8 or float8_e4m3fn) with fp32 `scale` (module docstring), in x's memory
    format (in `out`'s bytes when given)."""
    cfg = config or CONFIGS[0]
    fmt = torch.channels_last if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(
        memory_format=torch.channels_last) else torch.contiguous_format
    src = x.contiguous(memory_format=fmt)
    q = take(out, src.shape, dtype, src.device, fmt)
    n = src.numel()
    if n:
        _quantize_kernel[(triton.cdiv(n, cfg["BLOCK"]),)](src, q, n, float(scale), FP8=dtype == torch.float8_e4m3fn,
                                                          EXACT_DIV=not INTERPRET, BLOCK=cfg["BLOCK"],
                                                          num_warps=cfg["num_warps"])
    return q
