"""Fuse an int8 1x1 QuantConv with the 1x1 QuantConv that reads its output into one QuantConvChain
(kinds/quantized.py) with both outputs: a bottleneck's last conv and the next block's first,

    y = QuantConv(h, R=r){out_scale=s_y};  z = QuantConv(y){x_scale=s_y}   ⇒   y, z = QuantConvChain(h, r)

so that y (ResNet-50 layer 1: 51 MB at batch 64), still written for its other readers, is not read back for z.
Both stride 1, unpadded, group 1, int8 in and out; the second without residual; the first may be a QuantConvPair
of two stride-1 convs (layer 1's projection block, quant/fuse_conv_pair.py); the build target's `int8_chain_fits`
says which shapes the kernel takes. A precision pass (quant/pipeline.py): it runs where the build target has the
Gluon chain kernel (a Hopper GPU), after fuse_conv_pair.
"""

from __future__ import annotations

from kiln.ir import Layer, Network
from kiln.passes import PassContext
from kiln.quant.fuse_conv_pair import RESIDUAL, conv_operands, int8_pointwise


def _gemm(net: Network, layer: Layer) -> bool:
    """An int8 1x1 stride-1 QuantConv with a requantized output."""
    return int8_pointwise(net, layer) and tuple(layer.attrs.get("strides", (1, 1))) == (1, 1) and \
        layer.attrs.get("out_scale") is not None


def _pair(net: Network, layer: Layer) -> bool:
    """A QuantConvPair (int8 by construction) of two stride-1 convs: both GEMMs over the same rows."""
    return layer.kind == "QuantConvPair" and layer.attrs.get("out_scale") is not None and \
        tuple(layer.attrs.get("strides", (1, 1))) == (1, 1) == tuple(layer.attrs.get("strides2", (1, 1)))


def fuse_conv_chain(net: Network, ctx: PassContext) -> bool:
    """Fuse in place every such chain whose (K, N, N2, residual, K of a pair's second conv or 0) the target's
    `int8_chain_fits` takes (counted in the log as fuse_conv_chain.layers); whether any."""
    consumers, fused, removed, fits = net.consumers(), 0, set(), ctx.target.int8_chain_fits
    for y in list(net.layers):
        pair = y.kind == "QuantConvPair"
        residual = not pair and len(y.inputs) > RESIDUAL and bool(y.inputs[RESIDUAL])
        if y.name in removed or not (_gemm(net, y) or _pair(net, y)) or (residual and y.attrs.get("res_scale") is None):
            continue  # (a float residual: the kernel reads int8 ones)
        (n, k), out = net.constants[y.inputs[1]].shape[:2], y.outputs[0]
        kx = net.constants[y.inputs[5]].shape[1] if pair else 0
        z = next((c for c in consumers.get(out, []) if _gemm(net, c) and c.inputs[0] == out and out not in c.inputs[1:]
                  and not (len(c.inputs) > RESIDUAL and c.inputs[RESIDUAL]) and c.attrs["x_scale"] == y.attrs[
                      "out_scale"] and fits(k, n, net.constants[c.inputs[1]].shape[0], residual, kx)), None)
        if z is None:
            continue
        attrs = y.attrs | {"out2_scale": z.attrs["out_scale"], "activation2": z.attrs.get("activation", "none"),
                           "activation2_params": list(z.attrs.get("activation_params", []))}
        first = y.inputs[:4] + [""] if pair else (list(y.inputs) + [""] * 5)[:5]
        inputs = first + conv_operands(z)[1:] + (y.inputs[4:8] if pair else [])
        net.layers[net.layers.index(y)] = Layer(f"{y.name}+{z.name}", "QuantConvChain", inputs, [out, z.outputs[0]],
                                                attrs, y.precision, y.origin + z.origin)
        net.layers.remove(z)
        removed.add(z.name)
        fused += 1
    if fused:
        ctx.record("fuse_conv_chain.layers", fused)
    return bool(fused)
