"""Remove casts that change nothing, after precision assignment.

    y = Cast(x: f16 → f16)                      ⇒   readers of y read x
    b = Cast(a: f16 → f32); c = Cast(b → f16)   ⇒   readers of c read a (the first Cast goes once unread)

Only exact round trips go: the middle type must hold every value of the outer one, so that
f32 → f16 → f32 (which rounds) stays.
"""

from __future__ import annotations

import torch

from kiln.ir import DType, Network
from kiln.passes import PassContext
from kiln.passes.eliminate_dead import eliminate_dead


def holds_all(wide: DType, narrow: DType) -> bool:
    """Every value of type `narrow` is exactly representable in type `wide`."""
    if wide.is_int and narrow.is_int:
        (lo, hi), (nlo, nhi) = wide.int_range, narrow.int_range
        return lo <= nlo and nhi <= hi
    if not (wide.is_float and narrow.is_float) or DType.FP4E2M1 in (wide, narrow):
        return False
    w, n = torch.finfo(wide.torch), torch.finfo(narrow.torch)
    return w.eps <= n.eps and w.max >= n.max and w.smallest_normal <= n.smallest_normal


def remove_redundant_casts(net: Network) -> int:
    """Bypass no-op casts and exact round trips (module docstring); returns how many casts were bypassed."""
    producers, outputs = net.producers(), set(net.outputs)
    alias: dict[str, str] = {}
    kept = []
    for layer in net.layers:
        layer.inputs = [alias.get(i, i) for i in layer.inputs]
        source = _bypass(net, layer, producers) if layer.kind == "Cast" and layer.outputs[0] not in outputs else None
        if source is None:
            kept.append(layer)
        else:
            alias[layer.outputs[0]] = source
            del net.tensors[layer.outputs[0]]
    net.layers = kept
    if alias:
        eliminate_dead(net, PassContext())
    return len(alias)


def _bypass(net: Network, cast, producers) -> str | None:
    """The tensor that already holds this Cast's result, if any."""
    src, to = cast.inputs[0], cast.attrs["to"]
    if net.tensors[src].dtype is to:
        return src
    first = producers.get(src)
    if first is not None and first.kind == "Cast" and net.tensors[first.inputs[0]].dtype is to \
            and holds_all(net.tensors[src].dtype, to):
        return first.inputs[0]
    return None
