"""Convolutions on CUDA cores through Triton, with bias, residual and activation fused: depthwise ones (one filter per
channel, kernels/depthwise_conv.py) and dense ones of few input channels (a stem, kernels/direct_conv.py). 2-D,
constant weights; they read any input layout and write NHWC, so their configs are timed as NHWC."""

from __future__ import annotations

from kiln.kernels import conv, depthwise_conv, direct_conv
from kiln.kernels.common import TMA_ALIGN
from kiln.tactics.common import first
from kiln.tactics.int8_common import tma_device_reason
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import conv_reason, conv_rows, epilogue, mark_nhwc


def _depthwise_reason(spec: LayerSpec, device) -> str | None:
    w = spec.inputs[1]
    if w is not None and w.const is not None and not (w.const.shape[1] == 1
                                                      and spec.attrs.get("group", 1) == w.const.shape[0]):
        return "only depthwise convolutions (one filter per channel)"
    return conv_reason(spec, device)


def _direct_reason(spec: LayerSpec, device) -> str | None:
    w = spec.inputs[1]
    if spec.attrs.get("group", 1) != 1:
        return "grouped and depthwise convolutions"
    if w is not None and w.const is not None and w.const[0].numel() > direct_conv.MAX_TAPS:
        return f"more than {direct_conv.MAX_TAPS} taps (C·KH·KW): an implicit GEMM's job"
    return conv_reason(spec, device)


def _depthwise_configs(spec: LayerSpec, device, level: int):
    out, a = spec.outputs[0].shape, spec.attrs
    oh, ow = (d if isinstance(d, int) else None for d in (out[2:4] if out else (None, None)))
    c = spec.inputs[1].const.shape[0]
    rows = depthwise_conv.sweeps_rows(a["kernel_shape"], a["strides"], a["dilations"])
    size = spec.inputs[0].dtype.torch.itemsize
    tma = rows and tma_device_reason(device) is None and c * size % TMA_ALIGN == 0
    return mark_nhwc(depthwise_conv.configs(conv_rows(out), c, level, ow, oh, rows, tma, a["strides"][0], size))


def _direct_configs(spec: LayerSpec, device, level: int):
    dot = spec.inputs[0].dtype.torch.itemsize == 2
    return mark_nhwc(direct_conv.configs(conv_rows(spec.outputs[0].shape), spec.inputs[1].const.shape[0], level, dot))


def _compiler(launch, pack, keys):
    """A tactic's compile: `launch(x, packed weights, ..., config=, out=)` with the layer's attributes."""
    def compile_(spec: LayerSpec, config, device):
        a = spec.attrs
        w = pack(spec.inputs[1].const)
        kernel, strides, dilations = tuple(a["kernel_shape"]), tuple(a["strides"]), tuple(a["dilations"])
        pads = list(a["pads"][:4])
        act, act_alpha, act_beta = epilogue(a) if spec.kind == "FusedConv" else ("none", 1.0, 0.0)
        tiles = {k: config[k] for k in keys if k in config}  # configs cached before a key was added lack it

        def run(inputs, out=None):
            x, _, bias, residual = (list(inputs) + [None] * 4)[:4]
            return [launch(x, w, kernel, strides, pads, dilations, bias, residual, activation=act,
                           act_alpha=act_alpha, act_beta=act_beta, config=tiles, out=first(out))]

        return run
    return compile_


register(Tactic("triton_depthwise_conv", ("Conv", "FusedConv"),
                _compiler(depthwise_conv.depthwise_conv2d, depthwise_conv.pack_weight, depthwise_conv.CONFIG_KEYS),
                _depthwise_reason, _depthwise_configs, priority=30, writes_out=True))
register(Tactic("triton_direct_conv", ("Conv", "FusedConv"),
                _compiler(direct_conv.direct_conv2d, conv.pack_weight, direct_conv.CONFIG_KEYS),
                _direct_reason, _direct_configs, priority=30, writes_out=True))
