"""Fuse a Conv's epilogue — residual Add and activation — into one FusedConv layer.

    y = Conv(x, W, B); s = Add(y, r); z = Relu(s)   ⇒   z = FusedConv(x, W, B, r)  {residual, activation=Relu}
    y = Conv(x, W, B); z = Clip(y, 0, 6)             ⇒   z = FusedConv(x, W, B)     {activation=Clip [0, 6]}

Either step is optional. The residual r must have the conv output's shape (no broadcasting); the
activations are those of kinds/fused.py. Only when every intermediate has no reader outside the
pattern and is not a network output.
"""

from __future__ import annotations

from kiln.ir import Network
from kiln.passes.fuse_common import closed, fuse, match_activation, other_input, same_shape
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer


def fuse_conv_epilogue(net: Network, ctx: PassContext) -> bool:
    changed = False
    consumers = net.consumers()
    used: set[int] = set()
    # last first: where two convs meet in a residual Add (ResNet's downsample), the main path takes it
    for conv in [l for l in reversed(net.layers) if l.kind == "Conv"]:
        y = conv.outputs[0]
        layers, residual = [conv], None
        add = single_consumer(net, y, consumers)
        r = add and add.kind == "Add" and other_input(add, y)
        if r and same_shape(net, y, r, add.outputs[0]):
            layers, residual, y = layers + [add], r, add.outputs[0]
        act = match_activation(net, y, consumers)
        if act:
            layers, y = layers + act.layers, act.out
        if len(layers) == 1 or used & {id(l) for l in layers} or not closed(net, layers, {y}, consumers):
            continue
        inputs = (conv.inputs + [""] * 3)[:3] + ([residual] if residual else [])
        attrs = conv.attrs | {"residual": residual is not None, "activation": act.name if act else "none",
                              "activation_params": act.params if act else []}
        if fuse(net, layers, "FusedConv", inputs, [y], attrs):
            used |= {id(l) for l in layers}
            ctx.record("fuse_conv_epilogue.layers", len(layers) - 1)
            changed = True
    return changed
