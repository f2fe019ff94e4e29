"""Fuse a 1x1 int8 QuantConv whose only reader adds it as a quantized residual into that reader, also a 1x1 conv:
one QuantConvPair (kinds/quantized.py) sums both convs' fp32 values under one epilogue. A bottleneck block's last
conv and its downsample:

    a = QuantConv(h){out_scale=s_a};  y = QuantConv(x, R=a){res_scale=s_a}   ⇒   y = QuantConvPair(x, h)

The residual map (ResNet-50 layer 1: 51 MB at batch 64) is then never written nor read, and the sum skips its
int8 rounding. Both convs 1x1, unpadded, group 1, int8; the first without residual or activation. A precision
pass (quant/pipeline.py): it runs where the build target has the Gluon pair kernel (a Hopper GPU).
"""

from __future__ import annotations

from kiln.ir import Layer, Network
from kiln.kinds import qtype as qtypes
from kiln.kinds.conv import pointwise
from kiln.passes import PassContext
from kiln.passes.eliminate_dead import eliminate_dead

RESIDUAL = 4  # QuantConv's residual input


def int8_pointwise(net: Network, layer: Layer) -> bool:
    """An int8 QuantConv with a constant 1x1 weight, no padding, group 1."""
    return layer.kind == "QuantConv" and qtypes.of(layer.attrs) is qtypes.INT8 and \
        pointwise(layer.attrs, net.constants.get(layer.inputs[1]))


def conv_operands(layer: Layer) -> list[str]:
    """A QuantConv's X, W, w_scale and bias ("" when it has none)."""
    return (list(layer.inputs) + [""] * 4)[:4]


def fuse_conv_pair(net: Network, ctx: PassContext) -> bool:
    """Fuse every such pair in place (counted in the log as fuse_conv_pair.layers); whether any."""
    producers, consumers, fused = net.producers(), net.consumers(), 0
    for y in list(net.layers):
        r = y.inputs[RESIDUAL] if len(y.inputs) > RESIDUAL else ""
        if not r or y.attrs.get("res_scale") is None or y.attrs.get("out_scale") is None or not int8_pointwise(net, y):
            continue
        a = producers.get(r)
        if a is None or not int8_pointwise(net, a) or r in net.outputs or len(consumers.get(r, [])) != 1 or \
                (len(a.inputs) > RESIDUAL and a.inputs[RESIDUAL]) or a.attrs.get("activation", "none") != "none" \
                or a.attrs.get("out_scale") is None:
            continue
        attrs = {k: v for k, v in y.attrs.items() if k != "res_scale"}
        attrs |= {"x2_scale": a.attrs["x_scale"], "strides2": list(a.attrs.get("strides", [1, 1]))}
        net.layers[net.layers.index(y)] = Layer(y.name, "QuantConvPair", conv_operands(y) + conv_operands(a),
                                                list(y.outputs), attrs, y.precision, a.origin + y.origin)
        net.layers.remove(a)
        fused += 1
    if fused:
        eliminate_dead(net, PassContext())  # the residual tensors; the build's log counts only what the pass did
        ctx.record("fuse_conv_pair.layers", fused)
    return bool(fused)
