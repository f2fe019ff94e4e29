"""Reference implementations of the cast layer kinds: Cast (with ONNX's float8/float4/int4 rules) and BitCast.

Cast attributes: `to` (DType), `saturate` (bool, float8 targets), `round_mode` ("up", "down",
"nearest"; FLOAT8E8M0 targets). Rules, as ONNX defines them (its reference evaluator: ml_dtypes):

- float8 E4M3FN/E4M3FNUZ/E5M2/E5M2FNUZ: round to nearest even. saturate=True clamps out-of-range
  values and ±inf to ±max; saturate=False makes them NaN (±inf for E5M2). NaN stays NaN; the
  FNUZ types have no -0 (it becomes 0).
- FLOAT8E8M0 (a power of two, exponent only): rounds per round_mode on float32 bits; saturate keeps
  the largest exponent instead of overflowing to NaN.
- FLOAT4E2M1: round to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, out of range and ±inf to ±6.
- INT4/UINT4/INT2/UINT2: truncate toward zero, then wrap modulo 2**bits (e.g. 8 -> -8 as int4),
  as integer narrowing does for the other integer types.
- STRING: numbers become their shortest numpy text; text parses as a float ("INF", "NaN", ...).
"""

from __future__ import annotations

import numpy as np
import torch

from kiln.ir.dtype import DType, to_numpy, to_torch
from kiln.kinds.registry import DTYPE, INT, STR, kind

_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rounding thresholds between consecutive FP4 magnitudes; a tie goes to the even code.
_FP4_UP_AT = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
_E4M3FN_OVERFLOW = 464.0
_FLOAT8 = (DType.FP8E4M3, DType.FP8E5M2, DType.FP8E4M3FNUZ, DType.FP8E5M2FNUZ)
_NARROW_FLOATS = _FLOAT8 + (DType.FP8E8M0, DType.FP4E2M1)  # above this, rounding to E4M3FN passes its max 448


def _decode(x, src: DType):
    """A runtime value of type `src` as a tensor torch can convert (or a numpy array for STRING)."""
    if src is DType.FP4E2M1:
        codes = x.view(torch.uint8).long()
        table = torch.tensor(_FP4_VALUES + tuple(-v for v in _FP4_VALUES), device=x.device)
        return table[codes & 15]
    return x.view(src.carrier) if src.carrier != src.torch else x


def _to_float8(x: torch.Tensor, to: DType, saturate: bool) -> torch.Tensor:
    big = float(torch.finfo(to.torch).max)
    if saturate:
        return torch.where(x.isnan(), x, x.clamp(-big, big)).to(to.torch)
    y = x.to(to.torch)
    if to is DType.FP8E4M3:  # torch saturates E4M3FN; ONNX wants NaN
        y = torch.where(x.abs() > _E4M3FN_OVERFLOW, torch.tensor(float("nan"), dtype=to.torch, device=x.device), y)
    return y


def _to_e8m0(x: torch.Tensor, saturate: bool, round_mode: str) -> torch.Tensor:
    """Exponent of float32 x, rounded per round_mode on its mantissa bits; inf/NaN -> NaN (0xFF)."""
    bits = x.float().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    if round_mode == "up":
        up = (bits & 0x7FFFFF) != 0
    elif round_mode == "nearest":
        guard, rnd, sticky = (bits & 0x400000) != 0, (bits & 0x200000) != 0, (bits & 0x1FFFFF) != 0
        up = guard & (rnd | sticky | (exponent > 0))
    else:
        up = torch.zeros_like(exponent, dtype=torch.bool)
    if saturate:
        up &= exponent != 0xFE
    out = torch.where(exponent == 0xFF, 0xFF, exponent + up.int())
    return out.to(torch.uint8).view(torch.float8_e8m0fnu)


def _to_fp4(x: torch.Tensor) -> torch.Tensor:
    mag = x.float().abs()
    code = sum(((mag >= t) if tie_up else (mag > t)).to(torch.uint8) for t, tie_up in _FP4_UP_AT)
    sign = torch.signbit(x.float()) ^ x.isnan()  # ml_dtypes maps NaN to a zero of flipped sign
    code = torch.where(x.isnan(), torch.zeros_like(code), code)
    return (code | (sign.to(torch.uint8) << 3)).view(torch.float4_e2m1fn_x2)


def _to_narrow_int(x: torch.Tensor, to: DType) -> torch.Tensor:
    v = x.to(torch.int64)
    mask = (1 << to.bits) - 1
    v = v & mask
    if to.int_range[0] < 0:
        v = v - ((v >> (to.bits - 1)) << to.bits)  # sign-extend the low bits
    return v.to(to.carrier).view(to.torch)


def _from_string(x: np.ndarray, to: DType):
    parsed = np.vectorize(float, otypes=[np.float64])(x) if x.size else np.zeros(x.shape)
    return cast(to_torch(parsed), DType.FLOAT64, to)


def cast(x, src: DType, to: DType, saturate: bool = True, round_mode: str = "up"):
    """Convert runtime value `x` of type `src` to type `to` by ONNX Cast rules (module docstring)."""
    if src is to:
        return x
    if src is DType.STRING:
        return _from_string(x, to)
    if to is DType.STRING:
        return to_numpy(x).astype(np.str_).astype(object)
    x = _decode(x, src)
    if to in _NARROW_FLOATS and not x.is_floating_point():
        x = x.float()
    if to in _FLOAT8:
        return _to_float8(x, to, saturate)
    if to is DType.FP8E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if to is DType.FP4E2M1:
        return _to_fp4(x)
    if to.carrier != to.torch:
        return _to_narrow_int(x, to)
    return x.to(to.torch)


@kind("Cast", attrs={"round_mode": STR, "saturate": INT, "to": DTYPE.req})
def cast_ref(inputs, attrs):
    x = inputs[0]
    to, saturate, round_mode = attrs["to"], attrs.get("saturate", True), attrs.get("round_mode", "up")
    return [cast(x, DType.from_torch(x.dtype), to, saturate, round_mode)]


@kind("BitCast", attrs={"to": DTYPE.req})
def bit_cast(inputs, attrs):
    """Reinterpret the bits of each element as type `to` (same width; checked at import)."""
    return inputs[0].view(attrs["to"].torch)
