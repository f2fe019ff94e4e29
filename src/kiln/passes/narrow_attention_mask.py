"""Give FusedAttention its mask at the smallest shape it broadcasts from: attention broadcasts the mask itself.

    k = Reshape(pad) [B,1,1,S]; a = And(k, True [1,1,Sq,1]); e = Expand(a, [B,1,Sq,S]); m = Where(e, 0, -inf)
    y = FusedAttention(Q, KT, V, m)   ⇒   n = Where(k, 0, -inf) [B,1,1,S]; y = FusedAttention(Q, KT, V, n)

Hugging Face's padding masks arrive this way. The kernel then reads one mask value per key instead of a
[Sq, S] tile per query block, and no [B,1,Sq,S] tensor is made. Walked back through Expand, And with an operand
True everywhere (a constant, or arange(n) ≥ 0 as dynamic-shape exports write it), Or with an all-False constant,
Cast, and Where with one-element constant branches: each only broadcasts or maps elements, so the narrow mask
broadcast to the scores has the same values.
"""

from __future__ import annotations

import torch

from kiln.ir import Layer, Network
from kiln.passes.fuse_common import scalar
from kiln.passes.manager import PassContext

RANK = 4  # a mask of higher rank would not broadcast to the scores as it did before


def _rank_ok(net: Network, t: str) -> bool:
    shape = net.tensors[t].shape
    return shape is not None and len(shape) <= RANK


def _least(net: Network, t: str, producers) -> float | None:
    """A lower bound of every element of `t` where one is known: a Range's start (step > 0), through the layers
    that only move or broadcast elements."""
    layer = producers.get(t)
    while layer is not None and layer.kind in ("Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten"):
        layer = producers.get(layer.inputs[0])
    if layer is None or layer.kind != "Range":
        return None
    start, step = scalar(net, layer.inputs[0]), scalar(net, layer.inputs[2])
    return start if start is not None and step is not None and step > 0 else None


def _all_true(net: Network, t: str, producers) -> bool:
    """Whether boolean `t` is True everywhere: a constant, an And of such, or x ≥ c (x > c) where every x is."""
    c = net.constants.get(t)
    if c is not None:
        return c.dtype == torch.bool and bool(c.all())
    layer = producers.get(t)
    if layer is None:
        return False
    if layer.kind == "And":
        return all(_all_true(net, i, producers) for i in layer.inputs)
    if layer.kind in ("GreaterOrEqual", "Greater"):
        least, bound = _least(net, layer.inputs[0], producers), scalar(net, layer.inputs[1])
        return least is not None and bound is not None and (least >= bound if layer.kind == "GreaterOrEqual"
                                                            else least > bound)
    return False


def _identity_operand(net: Network, layer: Layer, producers) -> str | None:
    """For And with an operand that is True everywhere (or Or with an all-False constant): the other operand."""
    if layer.kind not in ("And", "Or") or len(layer.inputs) != 2:
        return None
    for mine, other in (layer.inputs, layer.inputs[::-1]):
        shape = net.tensors[mine].shape
        if other in net.constants or shape is None or len(shape) > RANK:
            continue
        c = net.constants.get(mine)
        if (layer.kind == "And" and _all_true(net, mine, producers)) or \
                (layer.kind == "Or" and c is not None and not bool(c.any())):
            return other
    return None


class _Narrower:
    """Narrow masks, each tensor once (every encoder layer's attention reads the same mask)."""

    def __init__(self, net: Network):
        self.net, self.producers, self.done = net, net.producers(), {}

    def __call__(self, t: str) -> str:
        if t not in self.done:
            self.done[t] = self._narrow(t)
        return self.done[t]

    def _narrow(self, t: str) -> str:
        net, layer = self.net, self.producers.get(t)
        if layer is None or not _rank_ok(net, t):
            return t
        if layer.kind == "Expand" and _rank_ok(net, layer.inputs[0]):
            return self(layer.inputs[0])
        other = _identity_operand(net, layer, self.producers)
        if other is not None and _rank_ok(net, other):
            return self(other)
        if (layer.kind == "Where" and all(scalar(net, i) is not None for i in layer.inputs[1:3])) or \
                layer.kind == "Cast":
            return self._remake(layer, t)
        return t

    def _remake(self, layer: Layer, t: str) -> str:
        """A copy of `layer` reading its narrowed first input (the layer itself where nothing narrowed)."""
        net, src = self.net, self(layer.inputs[0])
        if src == layer.inputs[0]:
            return t
        out = net.unique_name(f"{t}_narrow")
        net.add_tensor(out, net.tensors[t].dtype, net.tensors[src].shape)
        inputs = [src, *layer.inputs[1:]]
        net.layers.insert(net.layers.index(layer) + 1, Layer(net.unique_name(f"{layer.name}_narrow"), layer.kind,
                                                           inputs, [out], dict(layer.attrs), layer.precision,
                                                           list(layer.origin)))
        return out


def narrow_attention_mask(net: Network, ctx: PassContext) -> bool:
    narrow, changed = _Narrower(net), False
    for layer in [l for l in net.layers if l.kind == "FusedAttention"]:
        if len(layer.inputs) < 4 or not layer.inputs[3]:
            continue
        mask = narrow(layer.inputs[3])
        if mask != layer.inputs[3]:
            layer.inputs[3] = mask
            ctx.record("narrow_attention_mask.layers")
            changed = True
    return changed
