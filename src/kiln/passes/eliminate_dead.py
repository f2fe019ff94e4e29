"""Remove layers whose outputs nobody reads, and constants nobody reads.

    y = Relu(x); z = Exp(x)   (only y is a network output)   ⇒   y = Relu(x)
"""

from __future__ import annotations

from kiln.ir import Network
from kiln.passes.manager import PassContext


def eliminate_dead(net: Network, ctx: PassContext) -> bool:
    live = set(net.outputs)
    kept = []
    for layer in reversed(net.layers):
        if any(o and o in live for o in layer.outputs):
            kept.append(layer)
            live.update(i for i in layer.inputs if i)
    kept.reverse()
    dead_layers = len(net.layers) - len(kept)
    dead_consts = [c for c in net.constants if c not in live]
    produced = {o for layer in kept for o in layer.outputs if o}
    keep_names = live | produced | set(net.inputs) | set(net.constants) - set(dead_consts)
    net.layers = kept
    for c in dead_consts:
        del net.constants[c]
    for name in [n for n in net.tensors if n not in keep_names]:
        del net.tensors[name]
    if dead_layers or dead_consts:
        ctx.record("eliminate_dead.layers", dead_layers)
    return bool(dead_layers or dead_consts)
