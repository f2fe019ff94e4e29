"""Stride-2 Conv / FusedConv on ≤ 4 input channels (ResNet's 7x7 stem) in fp16, bf16 or fp32 as space-to-depth +
the Triton implicit-GEMM conv (kernels/conv.py): the image is regrouped into 16 channels once, then the ⌈K/2⌉x⌈K/2⌉
stride-1 conv runs as a ⌈K/2⌉x1 conv of S's overlapping row view (kernels/space_to_depth.py), each kernel row one
contiguous channel run a pixel instead of a 3-channel gather a tap. The autotuner keeps it where it is faster."""

from __future__ import annotations

from kiln.kernels import conv, space_to_depth
from kiln.kernels.common import smem_limit
from kiln.kinds.conv import resolve_pads
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import conv_reason, conv_rows, mark_nhwc
from kiln.tactics.triton_conv import conv_runner
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
    return conv_runner(spec, config, packed, (k2[0], 1), (1, 1), [0, 0, 0, 0], (1, 1),
                       lambda x: space_to_depth.rows(space_to_depth.space_to_depth(x, pads, size, CHANNELS), k2[1]))


register(Tactic("triton_conv_s2d", ("Conv", "FusedConv"), _compile, _supports, _configs, priority=30,
                writes_out=True))
