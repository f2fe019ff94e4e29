"""Reference implementations of activation kinds (attribute defaults are filled in by the importer)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.kinds.registry import FLOAT, INTS, STR, kind


def _float_ref(fn):
    """Register-ready reference applying `fn(x, attrs)` to the single input."""

    def ref(inputs, attrs):
        return fn(inputs[0], attrs)

    return ref


_ACTIVATIONS = {
    "Relu": lambda x, a: torch.relu(x),
    "LeakyRelu": lambda x, a: F.leaky_relu(x, a["alpha"]),
    "Elu": lambda x, a: F.elu(x, a["alpha"]),
    "Selu": lambda x, a: torch.where(x > 0, x, a["alpha"] * torch.expm1(x)) * a["gamma"],
    "Celu": lambda x, a: F.celu(x, a["alpha"]),
    "ThresholdedRelu": lambda x, a: torch.where(x > a["alpha"], x, torch.zeros_like(x)),
    "HardSigmoid": lambda x, a: torch.clamp(a["alpha"] * x + a["beta"], 0, 1),
    "HardSwish": lambda x, a: x * torch.clamp(x / 6 + 0.5, 0, 1),
    "Sigmoid": lambda x, a: torch.sigmoid(x),
    "Tanh": lambda x, a: torch.tanh(x),
    "Softplus": lambda x, a: F.softplus(x),
    "Softsign": lambda x, a: F.softsign(x),
    "Gelu": lambda x, a: F.gelu(x, approximate=a["approximate"]),
    "Mish": lambda x, a: F.mish(x),
    "Swish": lambda x, a: x * torch.sigmoid(a["alpha"] * x),
}

_ACTIVATION_ATTRS = {  # the attributes each kind of the loop below takes
    "Relu": {"consumed_inputs": INTS},
    "LeakyRelu": {"alpha": FLOAT.req, "consumed_inputs": INTS},
    "Elu": {"alpha": FLOAT.req, "consumed_inputs": INTS},
    "Selu": {"alpha": FLOAT.req, "consumed_inputs": INTS, "gamma": FLOAT},
    "Celu": {"alpha": FLOAT.req},
    "ThresholdedRelu": {"alpha": FLOAT.req},
    "HardSigmoid": {"alpha": FLOAT.req, "beta": FLOAT.req, "consumed_inputs": INTS},
    "HardSwish": {},
    "Sigmoid": {"consumed_inputs": INTS},
    "Tanh": {"consumed_inputs": INTS},
    "Softplus": {},
    "Softsign": {},
    "Gelu": {"approximate": STR},
    "Mish": {},
    "Swish": {"alpha": FLOAT.req},
}
for _name, _fn in _ACTIVATIONS.items():
    kind(_name, attrs=_ACTIVATION_ATTRS[_name])(_float_ref(_fn))


@kind("PRelu", attrs={"consumed_inputs": INTS})
def prelu(inputs, attrs):
    """x if x >= 0 else slope * x; slope broadcasts to x (unsigned x is returned as is)."""
    x, slope = inputs
    if x.dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return x
    return torch.where(x < 0, x * slope, x).to(x.dtype)


@kind("Shrink", attrs={"bias": FLOAT.req, "lambd": FLOAT.req})
def shrink(inputs, attrs):
    """x + bias below -lambd, x - bias above lambd, else 0; integers computed in float64."""
    x = inputs[0]
    v = x if x.dtype.is_floating_point else x.double()
    lambd, bias = attrs["lambd"], attrs["bias"]
    out = torch.where(v < -lambd, v + bias, torch.where(v > lambd, v - bias, torch.zeros_like(v)))
    return out.to(x.dtype)
