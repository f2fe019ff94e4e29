"""Fuse layer normalization written out in basic ops into LayerNormalization, and a residual Add
feeding a LayerNormalization into AddLayerNorm.

    m = ReduceMean(x); d = Sub(x, m); v = ReduceMean(Pow(d, 2) | Mul(d, d)); s = Sqrt(Add(v, ε));
    n = Div(d, s) | Mul(d, Reciprocal(s)); y = Add(Mul(n, γ), β)        ⇒   y = LayerNormalization(x, γ, β)  {axis, ε}
    s = Add(a, b); y = LayerNormalization(s, γ, β)                     ⇒   y, s = AddLayerNorm(a, b, γ, β)

The reductions run over trailing axes with keepdims; γ and β (each optional) are constants that
broadcast over the normalized axes only, stored as the normalized shape (γ = 1 when absent). Only
float32/float64 inputs: LayerNormalization takes statistics in fp32, which for half types would
differ from the ops it replaces. The Add's operands must have its output's shape; its sum stays
an output of AddLayerNorm when something else reads it.
"""

from __future__ import annotations

import torch

from kiln.ir import DType, Layer, Network
from kiln.passes.fuse_common import closed, fuse, other_input, same_shape, scalar
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer


def _reader(net: Network, t: str, consumers, kind: str, at: int | None = None) -> Layer | None:
    """The single reader of `t` if it is of `kind` (reading t as input `at` when given)."""
    layer = single_consumer(net, t, consumers)
    if layer is None or layer.kind != kind or (at is not None and layer.inputs[at:at + 1] != [t]):
        return None
    return layer


def _mean_axes(net: Network, layer: Layer, rank: int) -> int | None:
    """The first axis of a keepdims ReduceMean over the trailing axes, else None."""
    axes = layer.attrs.get("axes")
    if len(layer.inputs) > 1 or not layer.attrs.get("keepdims", 1) or not axes:
        return None
    axes = sorted(a % rank for a in axes)
    return axes[0] if axes == list(range(axes[0], rank)) else None


def _affine(net: Network, name: str, norm: tuple[int, ...]) -> torch.Tensor | None:
    """Constant `name` as a tensor of the normalized shape, if it broadcasts over those axes only."""
    c = net.constants.get(name)
    if not isinstance(c, torch.Tensor):
        return None
    lead = max(0, c.dim() - len(norm))
    if any(d != 1 for d in c.shape[:lead]):
        return None
    try:
        return torch.broadcast_to(c.reshape(c.shape[lead:]), norm).contiguous()
    except RuntimeError:
        return None


def _normalized(net: Network, d: str, consumers) -> tuple[list[Layer], str, str] | None:
    """(layers, ε's tensor, n) of n = d / sqrt(mean(d²) + ε), from the centred d, or None."""
    readers = list({id(l): l for l in consumers.get(d, [])}.values())  # Mul(d, d) reads d twice
    if len(readers) != 2 or d in net.outputs:
        return None
    sq = next((l for l in readers if (l.kind == "Pow" and l.inputs[0] == d and scalar(net, l.inputs[1]) == 2.0)
               or (l.kind == "Mul" and l.inputs == [d, d])), None)
    div = next((l for l in readers if l is not sq), None)
    if sq is None or div is None:
        return None
    mean = _reader(net, sq.outputs[0], consumers, "ReduceMean")
    add = mean and _reader(net, mean.outputs[0], consumers, "Add")
    eps = add and other_input(add, mean.outputs[0])
    sqrt = eps and _reader(net, add.outputs[0], consumers, "Sqrt")
    if not sqrt or scalar(net, eps) is None:
        return None
    layers = [sq, mean, add, sqrt]
    if div.kind == "Div" and div.inputs == [d, sqrt.outputs[0]]:
        return layers + [div], eps, div.outputs[0]
    recip = _reader(net, sqrt.outputs[0], consumers, "Reciprocal")
    if recip and div.kind == "Mul" and sorted(div.inputs) == sorted([d, recip.outputs[0]]):
        return layers + [recip, div], eps, div.outputs[0]
    return None


def _decomposed(net: Network, m1: Layer, consumers) -> tuple[list[Layer], dict, str, str, str] | None:
    """(layers, attrs, γ name, β name, output) of the written-out LayerNorm starting at ReduceMean m1."""
    x = net.tensors[m1.inputs[0]]
    if x.dtype not in (DType.FLOAT32, DType.FLOAT64) or x.shape is None:
        return None
    axis = _mean_axes(net, m1, len(x.shape))
    sub = axis is not None and _reader(net, m1.outputs[0], consumers, "Sub", 1)
    if not sub or sub.inputs[0] != x.name or not all(isinstance(d, int) for d in x.shape[axis:]):
        return None
    body = _normalized(net, sub.outputs[0], consumers)
    if body is None or _mean_axes(net, body[0][1], len(x.shape)) != axis:
        return None
    layers, eps, y = [m1, sub] + body[0], body[1], body[2]
    norm = tuple(x.shape[axis:])
    gamma = beta = None
    mul = single_consumer(net, y, consumers)
    if mul and mul.kind == "Mul" and (gamma := _affine(net, other_input(mul, y) or "", norm)) is not None:
        layers, y = layers + [mul], mul.outputs[0]
    add = single_consumer(net, y, consumers)
    if add and add.kind == "Add" and (beta := _affine(net, other_input(add, y) or "", norm)) is not None:
        layers, y = layers + [add], add.outputs[0]
    if not closed(net, layers, {y}, consumers) or net.tensors[y].shape != x.shape:
        return None
    gamma = torch.ones(norm, dtype=x.dtype.torch) if gamma is None else gamma.to(x.dtype.torch)
    attrs = {"axis": axis, "epsilon": scalar(net, eps), "stash_type": 1}
    return layers, attrs, gamma, beta, y


def _add_layernorm(net: Network, ln: Layer, producers, consumers) -> tuple[list[Layer], list[str], list[str]] | None:
    """(layers, inputs, outputs) of the AddLayerNorm made of `ln` and the Add producing its input."""
    s = ln.inputs[0]
    add = producers.get(s)
    if add is None or add.kind != "Add" or len(add.inputs) != 2 or not same_shape(net, s, *add.inputs):
        return None
    if any(o and (o in net.outputs or consumers.get(o)) for o in ln.outputs[1:]):
        return None
    escapes = s in net.outputs or len(consumers.get(s, [])) > 1
    return [add, ln], add.inputs + ln.inputs[1:], ln.outputs[:1] + ([s] if escapes else [])


def _constants(net: Network, base: str, values: list[torch.Tensor | None]) -> list[str]:
    """Add the given values as new constants; their names ("" for None)."""
    names = []
    for v in values:
        names.append("" if v is None else net.unique_name(base))
        if v is not None:
            net.add_constant(names[-1], v)
    return names


def fuse_layernorm(net: Network, ctx: PassContext) -> bool:
    changed = False
    consumers, producers = net.consumers(), net.producers()
    used: set[int] = set()
    for m1 in [l for l in net.layers if l.kind == "ReduceMean"]:
        match = None if id(m1) in used else _decomposed(net, m1, consumers)
        if match is None or used & {id(l) for l in match[0]}:
            continue
        layers, attrs, gamma, beta, y = match
        affine = [n for n in _constants(net, f"{m1.name}.affine", [gamma, beta]) if n]
        # only y leaves the pattern and its readers follow it, so fuse() finds a place
        fuse(net, layers, "LayerNormalization", [m1.inputs[0]] + affine, [y], attrs)
        used |= {id(l) for l in layers}
        ctx.record("fuse_layernorm.layers", len(layers) - 1)
        changed = True
    consumers, producers = net.consumers(), net.producers()
    for ln in [l for l in net.layers if l.kind == "LayerNormalization"]:
        match = _add_layernorm(net, ln, producers, consumers)
        if match is None or used & {id(l) for l in match[0]}:
            continue
        layers, inputs, outputs = match
        if fuse(net, layers, "AddLayerNorm", inputs, outputs, dict(ln.attrs)):
            used |= {id(l) for l in layers}
            ctx.record("fuse_layernorm.add_layernorm", 1)
            changed = True
    return changed
