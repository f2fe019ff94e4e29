"""The quantized element types of QuantConv / QuantGemm (attribute `qtype`, absent: int8) and their rounding.

int8: symmetric integers in [-127, 127], round half to even. fp8 (e4m3fn): the nearest e4m3 value, ties to even,
saturated to ±448. A scale maps a tensor's amax onto `qmax`: scale = amax / qmax, q = quantize(x / scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kiln.errors import InternalError
from kiln.ir import DType


@dataclass(frozen=True)
class QType:
    """One quantized type: its `qtype` attribute value, report label, IR dtype, largest magnitude, rounding."""

    name: str
    label: str
    dtype: DType
    qmax: float
    integer: bool   # integer products, accumulated exactly in int32 (a build keeps K·qmax² < 2³¹)

    @property
    def torch(self) -> torch.dtype:
        return self.dtype.torch

    def quantize(self, v: torch.Tensor) -> torch.Tensor:
        """fp32 values already divided by their scale → this type: saturated to ±qmax, rounded to nearest even."""
        v = v.float().clamp(-self.qmax, self.qmax)
        return (torch.round(v) if self.integer else v).to(self.torch)


INT8 = QType("int8", "int8", DType.INT8, 127.0, True)
FP8 = QType("fp8e4m3", "fp8", DType.FP8E4M3, 448.0, False)
QTYPES = {q.name: q for q in (INT8, FP8)}


def of(attrs) -> QType:
    """The qtype a quantized layer's attributes name (int8 when absent)."""
    name = attrs.get("qtype") or INT8.name
    if name not in QTYPES:
        raise InternalError(f"quantized layer with unknown qtype {name!r}")
    return QTYPES[name]


def of_dtype(dtype: DType | None) -> QType | None:
    """The qtype whose values have IR type `dtype`, or None."""
    return next((q for q in QTYPES.values() if q.dtype is dtype), None)
