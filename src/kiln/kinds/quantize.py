"""Reference implementations of the quantization kinds.

QuantizeLinear: inputs (x, y_scale, optional y_zero_point); attrs axis int, block_size int (0: per-tensor
  or per-axis), saturate bool (float8 outputs), output_dtype DType (resolved at import), precision
  DType|None (the division's dtype; None: x and scale promoted, as the ONNX reference divides).
  y = saturate(round_half_even(x / y_scale) + y_zero_point).
DequantizeLinear: inputs (x, x_scale, optional x_zero_point); attrs axis, block_size, output_dtype DType.
  y = (x - x_zero_point) · x_scale, computed in fp32 and rounded to output_dtype.
DynamicQuantizeLinear: input x (fp32) → (y uint8, y_scale fp32 scalar, y_zero_point uint8 scalar).
Narrow types (int4/int2/fp4/fp8) use the runtime representation of kiln.ir.dtype, converted by
kiln.kinds.cast.cast.
"""

from __future__ import annotations

import torch

from kiln.ir.dtype import DType
from kiln.kinds.cast import cast
from kiln.kinds.registry import DTYPE, INT, NONE, kind


def _to_float(t: torch.Tensor) -> torch.Tensor:
    """Any runtime numeric tensor (int4, fp4, fp8, e8m0, ...) as float32 values."""
    return cast(t, DType.from_torch(t.dtype), DType.FLOAT32)


def broadcast_param(p: torch.Tensor, x: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """A scale or zero point shaped to broadcast against x: scalar, 1-D along `axis`, or blocked along it."""
    axis = axis % max(x.dim(), 1)
    if block_size > 0:
        return p.repeat_interleave(block_size, dim=axis).narrow(axis, 0, x.shape[axis])
    if p.dim() == 1 and p.numel() > 1:
        return p.reshape([-1 if d == axis else 1 for d in range(x.dim())])
    return p.reshape(()) if p.numel() == 1 else p


def _division_dtype(x: torch.Tensor, scale: torch.Tensor, precision: DType | None) -> torch.dtype:
    if precision is not None:
        return precision.torch
    if not scale.dtype.is_floating_point or scale.dtype == torch.float8_e8m0fnu:
        return torch.float32
    return torch.promote_types(x.dtype, scale.dtype) if x.dtype.is_floating_point else scale.dtype


@kind("QuantizeLinear", attrs={"axis": INT, "block_size": INT, "output_dtype": DTYPE.req, "precision": DTYPE | NONE,
                               "saturate": INT})
def quantize_linear(inputs, attrs):
    x, scale, zp = (inputs + [None] * 3)[:3]
    out = attrs["output_dtype"]
    axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
    dt = _division_dtype(x, scale, attrs.get("precision"))
    q = x.to(dt) / broadcast_param(_to_float(scale), x, axis, block).to(dt)
    shift = 0.0 if zp is None else broadcast_param(_to_float(zp), x, axis, block).double()
    if out.is_int:
        low, high = out.int_range
        q = (torch.round(q).double() + shift).clamp(low, high)
        return cast(q, DType.FLOAT64, out)
    return cast((q.double() + shift).float(), DType.FLOAT32, out, bool(attrs.get("saturate", True)))


@kind("DequantizeLinear", attrs={"axis": INT, "block_size": INT, "output_dtype": DTYPE.req})
def dequantize_linear(inputs, attrs):
    x, scale, zp = (inputs + [None] * 3)[:3]
    axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
    y = _to_float(x)
    if zp is not None:
        y = y - broadcast_param(_to_float(zp), x, axis, block)
    y = y * broadcast_param(_to_float(scale), x, axis, block)
    return y.to(attrs["output_dtype"].torch)


@kind("DynamicQuantizeLinear", attrs={})
def dynamic_quantize_linear(inputs, attrs):
    """uint8 affine quantization with the range [min(x, 0), max(x, 0)] mapped onto [0, 255]; an empty
    range gets scale 1 (ONNX Runtime's `max == min ? 1.0f : (max - min) / 255`)."""
    x = inputs[0].float()
    low = torch.clamp(x.min(), max=0) if x.numel() else torch.zeros((), device=x.device)
    high = torch.clamp(x.max(), min=0) if x.numel() else torch.zeros((), device=x.device)
    scale = torch.where(high == low, torch.ones_like(high), (high - low) / 255)
    zp = torch.round((-low / scale).clamp(0, 255))
    y = (torch.round(x / scale) + zp).clamp(0, 255)
    return y.to(torch.uint8), scale.to(inputs[0].dtype), zp.to(torch.uint8)
