"""Replace Shape and Size of tensors whose (sliced) shape is known at build time by constants.

    s = Shape(x: float32[2,3,?])  start=0 end=2   ⇒   s = const [2, 3]

With the shapes constant, fold_constants then folds the Gather/Concat/Reshape arithmetic that
exporters build from them.
"""

from __future__ import annotations

import torch

from kiln.ir import Network
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import make_constant


def _slice(rank: int, start: int, end: int | None) -> slice:
    clamp = lambda v: min(max(v + rank if v < 0 else v, 0), rank)  # noqa: E731  (ONNX Shape clamps)
    return slice(clamp(start), clamp(rank if end is None else end))


def fold_shape_arithmetic(net: Network, ctx: PassContext) -> bool:
    changed = False
    for layer in list(net.layers):
        if layer.kind not in ("Shape", "Size") or not layer.inputs[0]:
            continue
        t = net.tensors[layer.inputs[0]]
        if t.shape is None or getattr(t, "kind", "tensor") != "tensor":
            continue
        if layer.kind == "Shape":
            dims = t.shape[_slice(len(t.shape), int(layer.attrs.get("start", 0) or 0), layer.attrs.get("end"))]
        else:
            dims = t.shape
        if not all(isinstance(d, int) for d in dims):
            continue
        if layer.kind == "Shape":
            value = torch.tensor(list(dims), dtype=torch.int64)
        else:
            n = 1
            for d in dims:
                n *= d
            value = torch.tensor(n, dtype=torch.int64)
        net.layers.remove(layer)
        make_constant(net, layer.outputs[0], value)
        changed = True
    return changed
