"""Evaluate, at build time, layers whose inputs are all constants, within an output-size budget.

    c = Add(const a, const b); y = Mul(x, c)   ⇒   y = Mul(x, const a+b)

Random kinds (not `pure`) are never folded; a layer whose outputs would exceed
`PassContext.fold_budget_bytes` stays a layer and is computed at run time.
"""

from __future__ import annotations

import torch

from kiln.errors import InputError, ModelError
from kiln.ir import Layer, Network
from kiln.kinds import registry
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import constant_inputs, make_constant


def _static_bytes(net: Network, layer: Layer) -> int | None:
    """Bytes the layer's outputs will take if their shapes are known, else None."""
    total = 0
    for o in layer.outputs:
        t = net.tensors.get(o) if o else None
        if t is None:
            continue
        if not t.is_static or getattr(t, "kind", "tensor") != "tensor":
            return None
        n = t.dtype.itemsize if t.dtype.value != "string" else 8
        for d in t.shape:
            n *= d
        total += n
    return total


def fold_constants(net: Network, ctx: PassContext) -> bool:
    changed = False
    for layer in list(net.layers):
        if not registry.get(layer.kind).pure or any(isinstance(v, Network) for v in layer.attrs.values()):
            continue
        values = constant_inputs(net, layer)
        if values is None:
            continue
        size = _static_bytes(net, layer)
        if size is not None and size > ctx.fold_budget_bytes:
            continue
        try:
            with torch.no_grad():
                outs = registry.run_reference(layer.kind, values, layer.attrs)
        except (RuntimeError, ValueError, IndexError, TypeError, InputError) as e:
            raise ModelError(f"layer {layer.name!r} ({layer.kind}, from ONNX nodes {layer.origin}) fails on its "
                             f"constant inputs: {str(e).splitlines()[0] if str(e) else type(e).__name__}; "
                             "fix the model's constants") from None
        if not all(isinstance(v, torch.Tensor) for v in outs):
            continue
        if sum(v.numel() * v.element_size() for v in outs) > ctx.fold_budget_bytes:
            continue
        net.layers.remove(layer)
        for name, value in zip(layer.outputs, outs):
            if name:
                make_constant(net, name, value.clone())
        changed = True
    return changed
