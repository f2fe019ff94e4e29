"""Helpers shared by the fuse_* passes: replacing a matched pattern by one layer, and matching the
activation epilogues of FusedConv / FusedGemm (names as in kinds/fused.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from kiln.ir import Layer, Network
from kiln.passes.rewrite import single_consumer


def same_shape(net: Network, *names: str) -> bool:
    """All tensors have the same fully known shape (ints, or identical symbolic dims)."""
    shapes = [net.tensors[n].shape if n in net.tensors else None for n in names]
    return all(s is not None and None not in s and s == shapes[0] for s in shapes)


def scalar(net: Network, name: str) -> float | None:
    """The value of a one-element numeric constant, else None."""
    v = net.constants.get(name)
    if not isinstance(v, torch.Tensor) or v.numel() != 1 or v.dtype == torch.bool or v.dtype.is_complex:
        return None
    return float(v.reshape(()))


def other_input(layer: Layer, name: str) -> str | None:
    """The other operand of a two-input layer that reads `name` once."""
    if len(layer.inputs) != 2 or layer.inputs.count(name) != 1:
        return None
    return layer.inputs[1 - layer.inputs.index(name)]


def closed(net: Network, layers: list[Layer], escapes: set[str], consumers: dict[str, list[Layer]]) -> bool:
    """Only `escapes` leave the pattern: every other output is read by pattern layers alone."""
    members = {id(l) for l in layers}
    for layer in layers:
        for o in layer.outputs:
            if o and o not in escapes and (o in net.outputs or any(id(r) not in members
                                                                   for r in consumers.get(o, []))):
                return False
    return True


def fuse(net: Network, layers: list[Layer], kind: str, inputs: list[str], outputs: list[str],
         attrs: dict) -> Layer | None:
    """Replace `layers` by one layer of `kind`, placed right after the producers of its inputs;
    None (network unchanged) when no position keeps the order topological."""
    members = {id(l) for l in layers}
    made_at = {o: i for i, l in enumerate(net.layers) for o in l.outputs if o}
    earliest = max((made_at[i] for i in inputs if i in made_at), default=-1)
    readers = [i for i, l in enumerate(net.layers) if id(l) not in members and set(l.inputs) & set(outputs)]
    if readers and min(readers) <= earliest:
        return None
    new = Layer(layers[0].name, kind, inputs, outputs, attrs, origin=[o for l in layers for o in l.origin])
    kept = [l for l in net.layers if id(l) not in members]
    pos = sum(1 for i, l in enumerate(net.layers) if id(l) not in members and i <= earliest)
    net.layers = kept[:pos] + [new] + kept[pos:]
    for layer in layers:
        for o in layer.outputs:
            if o and o not in outputs:
                net.tensors.pop(o, None)
    return new


@dataclass
class Activation:
    """A matched activation: its layers, name and params (kinds/fused.py), and its output tensor."""

    layers: list[Layer]
    name: str
    params: list = field(default_factory=list)
    out: str = ""


_SIMPLE = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "HardSwish": "HardSwish"}


def match_activation(net: Network, x: str, consumers: dict[str, list[Layer]]) -> Activation | None:
    """The activation applied to `x`, when every reader of `x` belongs to it (x is not an output)."""
    if x in net.outputs:
        return None
    readers = consumers.get(x, [])
    if len(readers) == 1:
        return _single(net, readers[0], x)
    return _silu(net, x, readers, consumers) or _erf_gelu(net, x, readers, consumers)


def _single(net: Network, layer: Layer, x: str) -> Activation | None:
    """Activations that are one layer reading x."""
    if layer.inputs[:1] != [x] or x in layer.inputs[1:] or len(layer.outputs) != 1:
        return None
    out = layer.outputs[0]
    if layer.kind in _SIMPLE:
        return Activation([layer], _SIMPLE[layer.kind], [], out)
    if layer.kind == "LeakyRelu":
        return Activation([layer], "LeakyRelu", [float(layer.attrs["alpha"])], out)
    if layer.kind == "Gelu":
        return Activation([layer], "GeluTanh" if layer.attrs.get("approximate") == "tanh" else "Gelu", [], out)
    if layer.kind == "Clip":
        return _clip(net, layer, out)
    return None


def _clip(net: Network, layer: Layer, out: str) -> Activation | None:
    bounds = []
    for k, key in ((1, "min"), (2, "max")):
        name = layer.inputs[k] if len(layer.inputs) > k else ""
        if name:
            value = scalar(net, name)
            if value is None:
                return None
            bounds.append(value)
        else:
            bounds.append(float(layer.attrs[key]) if key in layer.attrs else None)
    return Activation([layer], "Clip", bounds, out)


def _silu(net: Network, x: str, readers: list[Layer], consumers) -> Activation | None:
    """x * Sigmoid(x)."""
    kinds = sorted(l.kind for l in readers)
    if kinds != ["Mul", "Sigmoid"]:
        return None
    sig, mul = sorted(readers, key=lambda l: l.kind != "Sigmoid")
    if single_consumer(net, sig.outputs[0], consumers) is not mul or sorted(mul.inputs) != sorted([x, sig.outputs[0]]):
        return None
    return Activation([sig, mul], "SiLU", [], mul.outputs[0])


def _is(net: Network, name: str, value: float, tol: float = 0.0) -> bool:
    v = scalar(net, name)
    return v is not None and abs(v - value) <= tol


def _erf_gelu(net: Network, x: str, readers: list[Layer], consumers) -> Activation | None:
    """x·0.5·(1 + Erf(x/√2)) as exporters write it: Div(x, √2) or Mul(x, 1/√2) → Erf → Add 1, then
    the product of x, that and 0.5 in any association."""
    if len(readers) != 2:
        return None
    scaled = next((l for l in readers
                   if (l.kind == "Div" and l.inputs[0] == x and _is(net, l.inputs[1], math.sqrt(2), 1e-6))
                   or (l.kind == "Mul" and _is(net, other_input(l, x) or "", math.sqrt(0.5), 1e-6))), None)
    if scaled is None:
        return None
    erf = single_consumer(net, scaled.outputs[0], consumers)
    plus = erf and erf.kind == "Erf" and single_consumer(net, erf.outputs[0], consumers)
    if not plus or plus.kind != "Add" or not _is(net, other_input(plus, erf.outputs[0]) or "", 1.0):
        return None
    m1 = single_consumer(net, plus.outputs[0], consumers)
    if not m1 or m1.kind != "Mul":
        return None
    factor = other_input(m1, plus.outputs[0])
    layers = [scaled, erf, plus, m1]
    if factor == x:  # (x·e)·0.5
        last = single_consumer(net, m1.outputs[0], consumers)
        if not last or last.kind != "Mul" or not _is(net, other_input(last, m1.outputs[0]) or "", 0.5):
            return None
        layers.append(last)
    elif factor and _is(net, factor, 0.5):  # x·(0.5·e)
        last = single_consumer(net, m1.outputs[0], consumers)
        if not last or last.kind != "Mul" or other_input(last, m1.outputs[0]) != x:
            return None
        layers.append(last)
    else:  # (x·0.5)·e
        half = next((l for l in readers if l is not scaled), None)
        if (half is None or half.kind != "Mul" or half.outputs[0] != factor
                or not _is(net, other_input(half, x) or "", 0.5)):
            return None
        layers.insert(0, half)
        last = m1
    if {id(l) for l in readers} - {id(l) for l in layers}:
        return None
    return Activation(layers, "Gelu", [], last.outputs[0])
