"""Conv and FusedConv (bias, residual, activation) through the Triton implicit-GEMM kernel (kernels/conv.py):
2-D, group 1, constant weights; reads any input layout, writes NHWC, so its configs are timed as NHWC. Grids
that underfill the GPU also get split-K configs, each compiled kernel with its own scratch."""

from __future__ import annotations

import torch

from kiln.kernels import conv
from kiln.kernels.common import SplitScratch, sm_count, smem_limit
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import conv_reason, conv_rows, epilogue, mark_nhwc


def _supports(spec: LayerSpec, device) -> str | None:
    if spec.attrs.get("group", 1) != 1:
        return "grouped and depthwise convolutions"
    return conv_reason(spec, device)


def _configs(spec: LayerSpec, device, level: int):
    co, c, kh, kw = spec.inputs[1].const.shape
    return mark_nhwc(conv.configs(conv_rows(spec.outputs[0].shape), co, c, spec.outputs[0].dtype.torch.itemsize,
                                  smem_limit(device), level, sm_count(torch.device(device.torch_device)), kh * kw))


def conv_runner(spec: LayerSpec, config: dict, w_packed, kernel, strides, pads, dilations, prepare=None):
    """A FusedConv / Conv kernel through kernels/conv.py with `config`'s tiles (split-K with a scratch of its own);
    `prepare` maps the layer's input to what the conv reads (space-to-depth's row view, say)."""
    act, act_alpha, act_beta = epilogue(spec.attrs) if spec.kind == "FusedConv" else ("none", 1.0, 0.0)
    tiles = {k: config[k] for k in conv.CONFIG_KEYS + ("SPLIT_K",) if k in config}
    tf32, scratch = spec.tf32, SplitScratch()

    def run(inputs, out=None):
        x, _, bias, residual = (list(inputs) + [None] * 4)[:4]
        return [conv.conv2d(prepare(x) if prepare else x, w_packed, kernel, strides, pads, dilations, bias, residual,
                            activation=act, act_alpha=act_alpha, act_beta=act_beta, config=tiles, tf32=tf32,
                            out=first(out), scratch=scratch)]

    return run


def _compile(spec: LayerSpec, config, device):
    a = spec.attrs
    return conv_runner(spec, config, conv.pack_weight(spec.inputs[1].const), tuple(a["kernel_shape"]),
                       tuple(a["strides"]), list(a["pads"][:4]), tuple(a["dilations"]))


register(Tactic("triton_conv", ("Conv", "FusedConv"), _compile, _supports, _configs, priority=30,
                writes_out=True))
