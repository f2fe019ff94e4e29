"""A Gather whose constant indices count 0, 1, ..., n-1 along an axis of size n moves nothing: it becomes a Reshape
to its output's shape (a view, no kernel).

    y = Gather(x [..., n, ...], arange(n).reshape(s), axis)   ⇒   y = Reshape(x, x.shape[:axis] + s + x.shape[axis+1:])

transformers' BERT export (5.x) gathers its flattened attention mask this way, one kernel a call.
"""

from __future__ import annotations

import torch

from kiln.ir import Network
from kiln.passes.manager import PassContext


def gather_as_reshape(net: Network, ctx: PassContext) -> bool:
    changed = False
    for layer in net.layers:
        if layer.kind != "Gather" or len(layer.inputs) != 2 or len(layer.outputs) != 1:
            continue
        x, out = net.tensors.get(layer.inputs[0]), net.tensors.get(layer.outputs[0])
        idx = net.constants.get(layer.inputs[1])
        if (x is None or out is None or x.shape is None or out.shape is None or idx is None
                or idx.dtype not in (torch.int64, torch.int32) or not all(isinstance(d, int) for d in out.shape)):
            continue
        axis = layer.attrs.get("axis", 0) % len(x.shape)
        n = x.shape[axis]
        if not isinstance(n, int) or idx.numel() != n or not torch.equal(idx.flatten().long(), torch.arange(n)):
            continue
        shape = net.unique_name(f"{layer.name}.shape")
        net.add_constant(shape, torch.tensor(out.shape, dtype=torch.int64))
        layer.kind, layer.inputs, layer.attrs = "Reshape", [layer.inputs[0], shape], {"allowzero": 0}
        ctx.record("gather_as_reshape.layers")
        changed = True
    return changed
