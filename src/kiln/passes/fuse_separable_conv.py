"""Fuse a small depthwise conv and the 1x1 conv that alone reads it into one SeparableConv (kinds/fused.py):

    d = FusedConv(x, Wd, Bd){group = C, act1};  y = FusedConv(d, Wp, Bp, r){1x1, act2}   ⇒
    y = SeparableConv(x, Wd, Bd, Wp, Bp, r)

(either may be a plain Conv). MobileNet's inverted residual blocks end with that pair. At batch 1 each of their
layers is a few microseconds of launch and ramp, so one kernel instead of two saves a launch a block; on larger
maps the pair's own tuned kernels (row sweeps, TMA 1x1 GEMMs, cuBLAS) win, so only depthwise maps of at most
MAX_MAP values fuse, with static shapes. A pass of GPU builds (BuildTarget.gpu) after the precision stage, so that an
int8 build quantizes each conv first and only float pairs of one precision fuse.
"""

from __future__ import annotations

from kiln.ir import Layer, Network
from kiln.kinds.conv import pointwise
from kiln.passes.manager import PassContext

MAX_MAP = 1 << 19  # depthwise output values: MobileNetV2's largest at batch 1, 224², is 56·56·144 = 451,584
CONV_KINDS = ("Conv", "FusedConv")


def _weight(net: Network, layer: Layer):
    return net.constants.get(layer.inputs[1]) if len(layer.inputs) > 1 else None


def _activation(layer: Layer) -> tuple[str, list]:
    return layer.attrs.get("activation", "none"), list(layer.attrs.get("activation_params") or [])


def _small_depthwise(net: Network, layer: Layer) -> bool:
    """A 2-D depthwise conv (one filter per channel) without residual, whose output's shape is static and small."""
    w = _weight(net, layer)
    if layer.kind not in CONV_KINDS or w is None or w.dim() != 4 or w.shape[1] != 1 or \
            layer.attrs.get("group", 1) != w.shape[0] or layer.attrs.get("residual") or \
            layer.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return False
    shape = net.tensors[layer.outputs[0]].shape if layer.outputs[0] in net.tensors else None
    if not shape or not all(isinstance(d, int) for d in shape):
        return False
    size = 1
    for d in shape:
        size *= d
    return size <= MAX_MAP


def fuse_separable_conv(net: Network, ctx: PassContext) -> bool:
    """Fuse every such pair in place (counted in the log as fuse_separable_conv.layers); whether any."""
    producers, consumers, fused = net.producers(), net.consumers(), 0
    for p in list(net.layers):
        d = producers.get(p.inputs[0]) if p.inputs else None
        if p.kind not in CONV_KINDS or d is None or not pointwise(p.attrs, _weight(net, p)) or \
                list(p.attrs.get("strides", [1, 1])) != [1, 1] or not _small_depthwise(net, d) or \
                d.outputs[0] in net.outputs or len(consumers.get(d.outputs[0], [])) != 1 or d.precision != p.precision:
            continue
        (wd, bd), (wp, bp) = ((layer.inputs + [""])[1:3] for layer in (d, p))
        r = (p.inputs + ["", ""])[3] if p.attrs.get("residual") else ""
        act, params = _activation(d)
        pw_act, pw_params = _activation(p)
        attrs = {k: d.attrs[k] for k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
                 if k in d.attrs}
        attrs |= {"activation": act, "activation_params": params, "pw_activation": pw_act,
                  "pw_activation_params": pw_params, "residual": bool(r)}
        inputs = [d.inputs[0], wd, bd, wp, bp] + ([r] if r else [])
        net.layers[net.layers.index(p)] = Layer(p.name, "SeparableConv", inputs, list(p.outputs), attrs, p.precision,
                                                d.origin + p.origin)
        net.layers.remove(d)
        net.tensors.pop(d.outputs[0], None)
        fused += 1
    if fused:
        ctx.record("fuse_separable_conv.layers", fused)
    return bool(fused)
