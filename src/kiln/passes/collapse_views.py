"""Collapse a chain of layout layers that would copy one step at a time into one StridedView of its source.

    q = Gather(Squeeze(Transpose(Unsqueeze(Reshape(x))))); y = Reshape(Transpose(Reshape(q, [S, B·H, D])))
        ⇒   y = StridedView(x)  {shape, strides, offset}

torch.nn.MultiheadAttention's export splits the heads through [S, B·H, D], which is no view of the packed
projection, though the whole chain is one: each step alone copies, the chain as one does not. Only for static
shapes, a source that its producer writes contiguous, a chain the view tactics would copy somewhere, and a
composite that is an affine map of the source's row-major elements (found exactly from the dims' factors).
"""

from __future__ import annotations

import math

import torch

from kiln.ir import Layer, Network
from kiln.passes.manager import PassContext

CHAIN = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Gather")
# producers whose outputs may be views in another layout at run time: a chain from them is left alone
NOT_CONTIGUOUS = ("Slice", "Expand", "StridedView", "FusedAttention")


def _link(net: Network, layer: Layer) -> bool:
    """A chain layer: one output, static shapes, its other inputs constants; Gather only of one index."""
    if layer.kind not in CHAIN or len([o for o in layer.outputs if o]) != 1:
        return False
    x, y = net.tensors.get(layer.inputs[0]), net.tensors.get(layer.outputs[0])
    if x is None or y is None or not x.is_static or not y.is_static:
        return False
    if any(i and i not in net.constants for i in layer.inputs[1:]):
        return False
    return layer.kind != "Gather" or net.constants[layer.inputs[1]].dim() == 0


def _chain(net: Network, end: Layer, producers: dict[str, Layer]) -> list[Layer] | None:
    """The chain layers from the source down to `end`, or None when the source may not be contiguous."""
    chain, layer = [], end
    while layer is not None and _link(net, layer):
        chain.append(layer)
        layer = producers.get(layer.inputs[0])
    if not chain or layer is not None and layer.kind in CHAIN + NOT_CONTIGUOUS or chain[-1].inputs[0] in net.constants:
        return None
    return chain[::-1]


def _copies(net: Network, chain: list[Layer]) -> bool:
    """Whether the view tactics copy somewhere along the chain when the source is contiguous (on meta tensors)."""
    x = torch.empty(net.tensors[chain[0].inputs[0]].shape, device="meta")
    for layer in chain:
        a = layer.attrs
        if layer.kind == "Transpose":
            x = x.permute(a.get("perm") or list(range(x.dim()))[::-1])
        elif layer.kind == "Gather":
            x = x.select(a.get("axis", 0), int(net.constants[layer.inputs[1]]))
        else:
            try:
                x = x.view(net.tensors[layer.outputs[0]].shape)
            except RuntimeError:
                return True
    return False


def _regroup(dims: list[list[tuple[int, int]]], shape: tuple) -> list[list[tuple[int, int]]] | None:
    """The (size, stride) factors of `dims` regrouped into dims of `shape`, row-major: factors that are one run of
    the source merged first, a factor split where a dim ends inside it; None where no split fits."""
    factors: list[tuple[int, int]] = []
    for n, stride in (f for d in dims for f in d if f[0] != 1):
        if factors and factors[-1][1] == n * stride:  # one run of the source: merge, so any split of it fits
            factors[-1] = (factors[-1][0] * n, stride)
        else:
            factors.append((n, stride))
    out = []
    for size in shape:
        mine, need = [], size
        while need > 1:
            if not factors:
                return None
            n, stride = factors[0]
            if n <= need and need % n == 0:
                mine.append(factors.pop(0))
                need //= n
            elif n > need and n % need == 0:  # the dim takes the outer digits of this factor
                mine.append((need, stride * (n // need)))
                factors[0] = (n // need, stride)
                need = 1
            else:
                return None
        out.append(mine)
    return out if not factors else None


def _affine(net: Network, chain: list[Layer]) -> dict | None:
    """{shape, strides, offset} of the chain as one strided view of its source's row-major elements, or None.

    Exact, without touching elements: every dim is tracked as the (size, stride) factors of the source it
    enumerates, row-major; a Reshape regroups the factors, a Transpose permutes the dims, a Gather fixes one dim's
    digits into the offset. The chain is one view when each output dim's factors coalesce to a single stride."""
    shape = net.tensors[chain[0].inputs[0]].shape
    dims = [[(n, s)] for n, s in zip(shape, torch.empty(shape, device="meta").stride())]
    offset = 0
    for layer in chain:
        a = layer.attrs
        if layer.kind == "Transpose":
            dims = [dims[p] for p in (a.get("perm") or range(len(dims))[::-1])]
        elif layer.kind == "Gather":
            axis = a.get("axis", 0) % len(dims)
            index = int(net.constants[layer.inputs[1]]) % net.tensors[layer.inputs[0]].shape[axis]
            for n, stride in reversed(dims.pop(axis)):
                offset, index = offset + index % n * stride, index // n
        else:
            dims = _regroup(dims, net.tensors[layer.outputs[0]].shape)
            if dims is None:
                return None
    out_shape = [math.prod(n for n, _ in d) for d in dims]
    strides = list(torch.empty(out_shape, device="meta").stride())
    for k, factors in enumerate(dims):
        factors = [f for f in factors if f[0] != 1]
        if any(s1 != n2 * s2 for (_, s1), (n2, s2) in zip(factors, factors[1:])):
            return None
        if factors:
            strides[k] = factors[-1][1]
    return {"shape": out_shape, "strides": strides, "offset": offset}


def _key(net: Network, chain: list[Layer]) -> tuple:
    """What the composite of a chain depends on: the source shape, and each step's kind, attributes and constants."""
    return (tuple(net.tensors[chain[0].inputs[0]].shape),) + tuple(
        (l.kind, repr(sorted(l.attrs.items())), tuple(tuple(net.constants[i].reshape(-1).tolist()) if i else None
                                                      for i in l.inputs[1:]))
        for l in chain)


def collapse_views(net: Network, ctx: PassContext) -> bool:
    producers, consumers = net.producers(), net.consumers()
    memo: dict[tuple, dict | None] = {}
    changed = False
    for pos, end in enumerate(net.layers):
        out = end.outputs[0] if end.outputs else ""
        if end.kind not in CHAIN or out not in net.outputs and all(r.kind in CHAIN for r in consumers.get(out, [])):
            continue  # not a chain's last layer: its readers are layout layers too
        chain = _chain(net, end, producers)
        if chain is None or len(chain) < 2 or not _copies(net, chain):
            continue
        key = _key(net, chain)
        view = memo[key] if key in memo else memo.setdefault(key, _affine(net, chain))
        if view is None:
            continue
        new = Layer(end.name, "StridedView", [chain[0].inputs[0]], [out], dict(view), precision=end.precision,
                    origin=[o for l in chain for o in l.origin])
        net.layers[pos] = producers[out] = new
        ctx.record("collapse_views.layers", len(chain) - 1)
        changed = True
    return changed
