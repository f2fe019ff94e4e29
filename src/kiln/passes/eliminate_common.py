"""Common-subexpression elimination: a layer that repeats an earlier one (same kind, attributes, precision
and inputs, constants compared by value) is dropped and its readers read the earlier one's outputs.

    m0 = Where(mask, zero0, ninf0); ...; m1 = Where(mask, zero1, ninf1)   (zero0 == zero1, ninf0 == ninf1)
      ⇒   m0 = Where(mask, zero0, ninf0); the layers that read m1 read m0

BERT exports recompute the additive attention mask in every encoder layer. Random kinds are never
merged; networks with control-flow bodies (which may read outer values by name) are left alone.
"""

from __future__ import annotations

import torch

from kiln.ir import DType, Layer, Network
from kiln.passes.manager import PassContext

_RANDOM = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"})
_SMALL = 256  # constants up to this many elements are compared by value, larger ones by name


def _attr_key(value):
    """A hashable form of an attribute value, or raises TypeError for ones we do not compare."""
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _attr_key(v)) for k, v in value.items()))
    if isinstance(value, float) and value != value:
        return ("nan",)
    if value is None or isinstance(value, (int, float, str, bool, DType)):
        return value
    raise TypeError(type(value).__name__)


def _input_key(net: Network, name: str):
    c = net.constants.get(name)
    if isinstance(c, torch.Tensor) and c.numel() <= _SMALL and not c.dtype.is_complex:
        return ("const", str(c.dtype), tuple(c.shape), c.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return name


def _key(net: Network, layer: Layer) -> tuple | None:
    if layer.kind in _RANDOM or not layer.outputs:
        return None
    try:
        attrs = _attr_key(layer.attrs)
    except TypeError:
        return None
    return (layer.kind, layer.precision, attrs, tuple(_input_key(net, i) if i else "" for i in layer.inputs))


def eliminate_common(net: Network, ctx: PassContext) -> bool:
    if any(isinstance(v, Network) or (isinstance(v, list) and any(isinstance(x, Network) for x in v))
           for layer in net.layers for v in layer.attrs.values()):
        return False
    alias: dict[str, str] = {}
    seen: dict[tuple, Layer] = {}
    kept: list[Layer] = []
    outputs = set(net.outputs)
    for layer in net.layers:
        layer.inputs = [alias.get(i, i) for i in layer.inputs]
        key = _key(net, layer)
        first = seen.get(key) if key is not None else None
        if (first is not None and len(first.outputs) == len(layer.outputs) and not outputs & set(layer.outputs)
                and all(theirs or not mine for mine, theirs in zip(layer.outputs, first.outputs))):
            for mine, theirs in zip(layer.outputs, first.outputs):
                if mine:
                    alias[mine] = theirs
                    net.tensors.pop(mine, None)
            continue
        if key is not None and first is None:
            seen[key] = layer
        kept.append(layer)
    if len(kept) == len(net.layers):
        return False
    ctx.record("eliminate_common.layers", len(net.layers) - len(kept))
    net.layers = kept
    return True
