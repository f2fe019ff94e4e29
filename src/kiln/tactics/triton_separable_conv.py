"""SeparableConv (a depthwise conv and the 1x1 conv that reads it, passes/fuse_separable_conv.py) as one Triton
kernel (kernels/separable_conv.py): any input layout, NHWC output, so its configs are timed as NHWC."""

from __future__ import annotations

import torch

from kiln.kernels import separable_conv
from kiln.kernels.common import SplitScratch, sm_count
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import FUSED_ACTS, conv_reason, conv_rows, epilogue, mark_nhwc

X, WD, BD, WP, BP, R = range(6)


def _pointwise_epilogue(attrs: dict) -> tuple[str, float, float]:
    return epilogue({"activation": attrs["pw_activation"], "activation_params": attrs["pw_activation_params"]})


def _supports(spec: LayerSpec, device) -> str | None:
    wp = spec.inputs[WP]
    if wp is None or wp.const is None:
        return "1x1 weights are not a build-time constant"
    if spec.attrs.get("pw_activation", "none") not in FUSED_ACTS:
        return f"activation {spec.attrs['pw_activation']!r} has no Triton epilogue"
    return conv_reason(spec, device)


def _configs(spec: LayerSpec, device, level: int):
    wp = spec.inputs[WP].const
    return mark_nhwc(separable_conv.configs(conv_rows(spec.outputs[0].shape), wp.shape[1], wp.shape[0], level,
                                            sm_count(torch.device(device.torch_device))))


def _compile(spec: LayerSpec, config, device):
    a = spec.attrs
    wd, wp = separable_conv.pack_weights(spec.inputs[WD].const, spec.inputs[WP].const)
    geometry = (tuple(a["kernel_shape"]), tuple(a["strides"]), list(a["pads"][:4]), tuple(a["dilations"]))
    acts = {"act1": epilogue(a), "act2": _pointwise_epilogue(a)}
    tiles = {k: config[k] for k in separable_conv.CONFIG_KEYS + ("SPLIT_K",) if k in config}
    tf32, scratch = spec.tf32, SplitScratch()

    def run(inputs, out=None):
        x, _, bd, _, bp, residual = (list(inputs) + [None] * 6)[:6]
        return [separable_conv.separable_conv2d(x, wd, wp, *geometry, bd, bp, residual, **acts, tf32=tf32,
                                                config=tiles, out=first(out), scratch=scratch)]

    return run


register(Tactic("triton_separable_conv", ("SeparableConv",), _compile, _supports, _configs, priority=30,
                writes_out=True))
