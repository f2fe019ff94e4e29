"""Reference implementations of linear-algebra kinds.

Einsum: attr equation str (ONNX/numpy syntax, ellipsis allowed); any number of inputs.
Det: determinant over the last two dims, no attributes.
"""

from __future__ import annotations

import torch

from kiln.kinds.matmul import wide_compute
from kiln.kinds.registry import STR, kind


@kind("Einsum", attrs={"equation": STR.req})
def einsum(inputs, attrs):
    return wide_compute(lambda *ts: torch.einsum(attrs["equation"], *ts), *inputs)


@kind("Det", attrs={})
def det(inputs, attrs):
    x = inputs[0]
    return torch.linalg.det(x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)).to(x.dtype)
