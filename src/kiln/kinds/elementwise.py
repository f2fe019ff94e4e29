"""Reference implementations of elementwise arithmetic, comparison and logic kinds."""

from __future__ import annotations

import torch

from kiln.kinds.registry import kind

_BINARY = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul,
    "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt,
    "LessOrEqual": torch.le, "GreaterOrEqual": torch.ge,
    "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
}


def _binary(op):
    def ref(inputs, attrs):
        return op(inputs[0], inputs[1])

    return ref


for _name, _op in _BINARY.items():
    kind(_name)(_binary(_op))


@kind("Div")
def div(inputs, attrs):
    a, b = inputs
    if not a.dtype.is_floating_point:
        return torch.div(a, b, rounding_mode="trunc")
    return a / b
