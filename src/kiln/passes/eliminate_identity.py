"""Bypass layers that pass their input through unchanged: Identity, inference-mode Dropout, no-op Cast.

    y = Identity(x); z = Relu(y)   ⇒   z = Relu(x)

A network output keeps its name: if the bypassed output is one, the layer stays.
"""

from __future__ import annotations

from kiln.ir import Layer, Network
from kiln.passes.manager import PassContext


def _is_passthrough(net: Network, layer: Layer) -> bool:
    if not layer.inputs or not layer.inputs[0] or not layer.outputs[0]:
        return False
    src, dst = net.tensors.get(layer.inputs[0]), net.tensors.get(layer.outputs[0])
    if src is None or dst is None or src.dtype != dst.dtype or getattr(src, "kind", None) != getattr(dst, "kind", None):
        return False
    if layer.kind == "Identity":
        return True
    if layer.kind == "Dropout":  # inference: y = x, unless training_mode is a non-constant or true
        extra = [o for o in layer.outputs[1:] if o]
        training = layer.inputs[2] if len(layer.inputs) > 2 else ""
        if extra or (training and not (training in net.constants and not bool(net.constants[training]))):
            return False
        return True
    return layer.kind in ("Cast", "CastLike")  # same dtype in and out (checked above)


def eliminate_identity(net: Network, ctx: PassContext) -> bool:
    changed = False
    for layer in list(net.layers):
        if layer.kind not in ("Identity", "Dropout", "Cast", "CastLike") or not _is_passthrough(net, layer):
            continue
        out = layer.outputs[0]
        if out in net.outputs:
            continue
        net.layers.remove(layer)
        net.replace_uses(out, layer.inputs[0])
        net.tensors.pop(out, None)
        changed = True
    return changed
