"""Checks the Triton tactics share: one float dtype across the values a kernel touches, the device's support."""

from __future__ import annotations

import math

from kiln.kernels.common import dtype_reason
from kiln.tactics.common import float_io
from kiln.tactics.spec import LayerSpec, ValueSpec


def io_reason(spec: LayerSpec, values: list[ValueSpec | None], device) -> str | None:
    """None if `values` (inputs..., output last) share one fp32/fp16/bf16 dtype the device runs, else why not."""
    sub = LayerSpec(spec.name, spec.kind, {}, tuple(values[:-1]), (values[-1],))
    return float_io(sub) or dtype_reason(values[-1].dtype.torch, device)


def rows(v: ValueSpec) -> int | None:
    """The number of rows of a value seen as 2-D over its last dim (None when unknown)."""
    dims = v.shape[:-1] if v.shape else None
    return math.prod(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None
