"""Stride-2 Conv / FusedConv on ≤ 4 input channels (ResNet's 7x7 stem) in fp16, bf16 or fp32 as space-to-depth +
the Triton implicit-GEMM conv (kernels/conv.py): the image is regrouped into 16 channels once, then the ⌈K/2⌉x⌈K/2⌉
stride-1 conv runs as a ⌈K/2⌉x1 conv of S's overlapping row view (kernels/space_to_depth.py), each kernel row one
contiguous channel run a pixel instead of a 3-channel gather a tap. The autotuner keeps it where it is faster."""

from __future__ import annotations

from kiln.kernels import conv, space_to_depth
from kiln.kernels.common import SplitScratch, smem_limit
from kiln.kinds.conv import resolve_pads
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import conv_reason, conv_rows, epilogue, mark_nhwc
from kiln.tactics.triton_int8_s2d import CHANNELS, s2d_reason


def _supports(spec: LayerSpec, device) -> str | None:
    return s2d_reason(spec, ("Conv", "FusedConv")) or conv_reason(spec, device)


def _configs(spec: LayerSpec, device, level: int):
    co, _, _, kw = spec.inputs[1].const.shape
    return mark_nhwc(conv.configs(conv_rows(spec.outputs[0].shape), co, (kw + 1) // 2 * CHANNELS,
                                  spec.outputs[0].dtype.torch.itemsize, smem_limit(device), level))


def _compile(spec: LayerSpec, config, device):
    w = spec.inputs[1].const
    k2, size = space_to_depth.geometry(tuple(w.shape[2:]), tuple(spec.outputs[0].shape[2:]))
    packed = conv.pack_weight(space_to_depth.row_weight(space_to_depth.weight(w, CHANNELS)))
    pads = resolve_pads(tuple(spec.inputs[0].shape[2:]), spec.attrs)[:2]
    act, act_alpha, act_beta = epilogue(spec.attrs) if spec.kind == "FusedConv" else ("none", 1.0, 0.0)
    tiles = {k: config[k] for k in conv.CONFIG_KEYS + ("SPLIT_K",) if k in config}
    tf32, scratch = spec.tf32, SplitScratch()

    def run(inputs, out=None):
        x, _, bias, residual = (list(inputs) + [None] * 4)[:4]
        view = space_to_depth.rows(space_to_depth.space_to_depth(x, pads, size, CHANNELS), k2[1])
        return [conv.conv2d(view, packed, (k2[0], 1), (1, 1), [0, 0, 0, 0], (1, 1), bias, residual, activation=act,
                            act_alpha=act_alpha, act_beta=act_beta, config=tiles, tf32=tf32, out=first(out),
                            scratch=scratch)]

    return run


register(Tactic("triton_conv_s2d", ("Conv", "FusedConv"), _compile, _supports, _configs, priority=30,
                writes_out=True))
