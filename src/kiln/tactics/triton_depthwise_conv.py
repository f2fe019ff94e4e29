"""Depthwise Conv and FusedConv (bias, residual, activation) through the Triton kernel of kernels/depthwise_conv.py:
2-D, one filter per channel (group = channels), constant weights; reads any input layout, writes NHWC, so its
configs are timed as NHWC."""

from __future__ import annotations

from kiln.kernels import depthwise_conv
from kiln.tactics.common import first, rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import FUSED_ACTS, conv_rows, epilogue, io_reason, mark_nhwc


def _supports(spec: LayerSpec, device) -> str | None:
    a, w = spec.attrs, spec.inputs[1]
    if w is None or w.const is None:
        return "weights are not a build-time constant"
    if rank(spec.inputs[0]) != 4 or len(a.get("kernel_shape", ())) != 2:
        return "only 2-D convolutions"
    if w.const.shape[1] != 1 or a.get("group", 1) != w.const.shape[0]:
        return "only depthwise convolutions (one filter per channel)"
    if a.get("auto_pad", "NOTSET") != "NOTSET":
        return "pads are not explicit (input shape unknown at build)"
    if a.get("activation", "none") not in FUSED_ACTS:
        return f"activation {a['activation']!r} has no Triton epilogue"
    if len(spec.inputs) > 2 and spec.inputs[2] is not None and rank(spec.inputs[2]) != 1:
        return "bias is not 1-D"
    return io_reason(spec, [v for v in (*spec.inputs, spec.outputs[0]) if v is not None], device)


def _configs(spec: LayerSpec, device, level: int):
    return mark_nhwc(depthwise_conv.configs(conv_rows(spec.outputs[0].shape), spec.inputs[1].const.shape[0], level))


def _compile(spec: LayerSpec, config, device):
    a = spec.attrs
    w = depthwise_conv.pack_weight(spec.inputs[1].const)
    kernel, strides, dilations = tuple(a["kernel_shape"]), tuple(a["strides"]), tuple(a["dilations"])
    pads = list(a["pads"][:4])
    act, act_alpha, act_beta = epilogue(a) if spec.kind == "FusedConv" else ("none", 1.0, 0.0)
    tiles = {k: config[k] for k in depthwise_conv.CONFIG_KEYS}

    def run(inputs, out=None):
        x, _, bias, residual = (list(inputs) + [None] * 4)[:4]
        return [depthwise_conv.depthwise_conv2d(x, w, kernel, strides, pads, dilations, bias, residual,
                                                activation=act, act_alpha=act_alpha, act_beta=act_beta,
                                                config=tiles, out=first(out))]

    return run


register(Tactic("triton_depthwise_conv", ("Conv", "FusedConv"), _compile, _supports, _configs, priority=30,
                writes_out=True))
