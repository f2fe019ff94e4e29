"""Collapse a chain of layout layers that would copy one step at a time into one StridedView of its source.

    q = Gather(Squeeze(Transpose(Unsqueeze(Reshape(x))))); y = Reshape(Transpose(Reshape(q, [S, B·H, D])))
        ⇒   y = StridedView(x)  {shape, strides, offset}

torch.nn.MultiheadAttention's export splits the heads through [S, B·H, D], which is no view of the packed
projection, though the whole chain is one: each step alone copies, the chain as one does not. Only for static
shapes, a source that its producer writes contiguous, a chain the view tactics would copy somewhere, and a
composite that is an affine map of the source's row-major elements (checked exactly, element by element).
"""

from __future__ import annotations

import math

import torch

from kiln.ir import Layer, Network
from kiln.kinds import run_reference
from kiln.passes.manager import PassContext

CHAIN = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Gather", "StridedView")
# producers whose outputs may be views in another layout at run time: a chain from them is left alone
NOT_CONTIGUOUS = ("Slice", "Expand", "FusedAttention")
MAX_ELEMENTS = 1 << 26  # the exact check builds the source's element numbers: above this, leave the chain


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
        elif layer.kind == "StridedView":
            if not x.is_contiguous():
                return True
            x = x.as_strided(a["shape"], a["strides"], a["offset"])
        else:
            try:
                x = x.view(net.tensors[layer.outputs[0]].shape)
            except RuntimeError:
                return True
    return False


def _affine(net: Network, chain: list[Layer]) -> dict | None:
    """{shape, strides, offset} of the chain as one strided view of its source's row-major elements, or None."""
    shape = net.tensors[chain[0].inputs[0]].shape
    n = math.prod(shape)
    if n == 0 or n > MAX_ELEMENTS:
        return None
    o = torch.arange(n, dtype=torch.int64).reshape(shape)
    for layer in chain:
        consts = [net.constants[i] if i else None for i in layer.inputs[1:]]
        o = run_reference(layer.kind, [o, *consts], layer.attrs)[0]
    if o.numel() == 0:
        return None
    base = int(o.reshape(-1)[0])
    strides = list(torch.empty(o.shape, device="meta").stride())
    expected = torch.full([1] * o.dim(), base, dtype=torch.int64)
    for k, size in enumerate(o.shape):
        if size > 1:
            strides[k] = int(o.select(k, 1).reshape(-1)[0]) - base
            along = [size if j == k else 1 for j in range(o.dim())]
            expected = expected + torch.arange(size).reshape(along) * strides[k]
    if min(strides, default=0) < 0 or not torch.equal(o, expected.expand(o.shape)):
        return None
    return {"shape": list(o.shape), "strides": strides, "offset": base}


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
