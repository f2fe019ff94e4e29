"""QuantConvPair (two 1x1 int8 convs summed under one epilogue, quant/fuse_conv_pair.py): through the Gluon pair
kernel (kernels/int8_conv_pair.py, Hopper: neither the second conv's fp32 map nor an int8 copy of it touches
memory), or, on any GPU, as two Triton implicit-GEMM convs (kernels/int8_conv.py): the second writes its fp32
value, which the first adds as a float residual, the same fp32 operations in the same order. This module holds
the launchers and checks; tactics/quant_conv_pair.py registers the tactics."""

from __future__ import annotations

from kiln.kernels import int8_conv, int8_conv_pair
from kiln.kernels.common import smem_limit
from kiln.kinds.qtype import INT8
from kiln.tactics import int8_lowering
from kiln.tactics.common import first, rank
from kiln.tactics.int8_common import tma_device_reason
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import act_kwargs, epilogue, mark_nhwc

X, W, W_SCALE, BIAS, X2, W2, W2_SCALE, BIAS2 = range(8)  # QuantConvPair's inputs


def supports_pair(spec: LayerSpec, device) -> str | None:
    a = spec.attrs
    if spec.kind != "QuantConvPair" or int8_lowering.qtype(spec) is not INT8:
        return "int8 QuantConvPair only"
    if any(spec.inputs[k] is None or spec.inputs[k].const is None for k in (W, W_SCALE, W2, W2_SCALE)) or any(
            spec.inputs[k] is not None and spec.inputs[k].const is None for k in (BIAS, BIAS2)):
        return "weights, scales and biases must be build-time constants"
    if rank(spec.inputs[X]) != 4 or rank(spec.inputs[X2]) != 4 or not (spec.inputs[X].static and
                                                                       spec.inputs[X2].static):
        return "2-D convolutions with static shapes only"
    if a.get("activation", "none") not in int8_lowering.ACTIVATIONS or a.get("out_scale") is None:
        return "an int8 output with one of the int8 epilogue's activations only"
    return None


def _epilogue_constants(spec: LayerSpec):
    """Both convs' combined scales and biases (fp32 [CO] each, a bias None when absent)."""
    a, i = spec.attrs, spec.inputs
    return (int8_lowering.combined_scale(a["x_scale"], i[W_SCALE].const), int8_lowering.const_bias(spec, BIAS),
            int8_lowering.combined_scale(a["x2_scale"], i[W2_SCALE].const), int8_lowering.const_bias(spec, BIAS2))


def split_configs(spec: LayerSpec, device, level: int):
    """The split tactics' tiles (pair and chain): the first conv's Triton implicit-GEMM tiles over the output map."""
    out, c = spec.outputs[0].shape, spec.inputs[W].const.shape[1]
    return mark_nhwc(int8_conv.configs(out[0] * out[2] * out[3], out[1], c, smem_limit(device), level))


def compile_split(spec: LayerSpec, config, device):
    a = spec.attrs
    w, w2 = (int8_conv.pack_weight(spec.inputs[k].const) for k in (W, W2))
    scale, bias, scale2, bias2 = _epilogue_constants(spec)
    acts = act_kwargs(a)
    tiles = {k: config[k] for k in int8_conv.CONFIG_KEYS}
    conv = dict(kernel=(1, 1), pads=[0] * 4, dilations=(1, 1), config=tiles)

    def run(inputs, out=None):
        r = int8_conv.conv2d(inputs[X2], w2, scale2, strides=tuple(a["strides2"]), bias=bias2, **conv)  # fp32
        return [int8_conv.conv2d(inputs[X], w, scale, strides=tuple(a["strides"]), bias=bias, residual=r,
                                 out_scale=a["out_scale"], **acts, out=first(out), **conv)]

    return run


def _wgmma_reason(spec: LayerSpec) -> str | None:
    if not int8_conv_pair.available():
        return "this triton has no Gluon"
    if epilogue(spec.attrs)[0] not in int8_conv_pair.wg.ACTIVATIONS:
        return f"activations {', '.join(int8_conv_pair.wg.ACTIVATIONS)} only"
    if any(spec.inputs[k].const.shape[0] % 16 or spec.inputs[k].const.shape[1] % 16 for k in (W, W2)):
        return "channels must be multiples of 16 (TMA's 16-byte rows)"
    return None


def supports_wgmma(spec: LayerSpec, device) -> str | None:
    reason = supports_pair(spec, device) or _wgmma_reason(spec) or tma_device_reason(device)
    if reason is None and not wgmma_configs(spec, device, 3):
        return "no tile fits: both convs' weight blocks too big for shared memory"
    return reason


def wgmma_configs(spec: LayerSpec, device, level: int):
    out, (c, c2) = spec.outputs[0].shape, (spec.inputs[k].const.shape[1] for k in (W, W2))
    return mark_nhwc(int8_conv_pair.configs(out[2], out[3], out[1], c, c2, smem_limit(device)))


def compile_wgmma(spec: LayerSpec, config, device):
    a = spec.attrs
    w, w2 = (spec.inputs[k].const.reshape(spec.inputs[k].const.shape[:2]).contiguous() for k in (W, W2))
    scale, bias, scale2, bias2 = _epilogue_constants(spec)
    (sh, sw), (sh2, sw2) = a["strides"], a["strides2"]
    kw = dict(out_scale=a["out_scale"], activation=epilogue(a)[0],
              config={k: config[k] for k in int8_conv_pair.CONFIG_KEYS})

    def run(inputs, out=None):  # a strided 1x1 conv reads its input's subsample
        return [int8_conv_pair.conv_pair(inputs[X][:, :, ::sh, ::sw], w, scale, bias, inputs[X2][:, :, ::sh2, ::sw2],
                                         w2, scale2, bias2, out=first(out), **kw)]

    return run


def fast_on(device) -> bool:
    """Whether `device` runs QuantConvPair through the Gluon pair kernel (a CUDA Hopper GPU and a triton with
    Gluon): where the build fuses such pairs."""
    return getattr(device, "backend", None) == "cuda" and int8_conv_pair.available() and \
        tma_device_reason(device) is None
