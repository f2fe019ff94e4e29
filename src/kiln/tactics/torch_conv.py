"""Convolution through cuDNN (torch), in NCHW or NHWC (channels_last) memory format, native dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.tactics.common import float_io, rank, tf32
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


def cudnn_reason(spec: LayerSpec, device) -> str | None:
    """Why cuDNN (through F.convNd) cannot run this Conv, or None; cudnn_fused_conv checks its plain conv here."""
    if spec.inputs[1] is None or spec.inputs[1].const is None:
        return "weights are not a build-time constant"
    if rank(spec.inputs[0]) not in _CONV:
        return "only 1-D, 2-D and 3-D convolutions"
    if spec.attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return "pads are not explicit (input shape unknown at build)"
    return float_io(spec)


def cudnn_configs(spec: LayerSpec, device, level: int):
    """NCHW, and NHWC for a 2-D conv: the memory layouts cuDNN is timed in."""
    return [{"layout": "nchw"}] + ([{"layout": "nhwc"}] if rank(spec.inputs[0]) == 4 else [])


def compile_cudnn(spec: LayerSpec, config, device):
    """The Conv as F.convNd in the config's layout (cudnn_fused_conv adds its epilogue to this kernel)."""
    a = spec.attrs
    n = len(a["kernel_shape"])
    pads = list(a["pads"])
    fmt = torch.channels_last if config.get("layout") == "nhwc" else torch.contiguous_format
    w = spec.inputs[1].const.contiguous(memory_format=fmt)
    b = spec.inputs[2].const if len(spec.inputs) > 2 and spec.inputs[2] is not None else None
    conv, allow_tf32 = _CONV[n + 2], spec.tf32
    symmetric = pads[:n] == pads[n:]
    torch_pads = [p for i in reversed(range(n)) for p in (pads[i], pads[n + i])]

    def run(inputs):
        x = inputs[0].contiguous(memory_format=fmt) if fmt is torch.channels_last else inputs[0]
        bias = b if b is not None else (inputs[2] if len(inputs) > 2 else None)
        if not symmetric:
            x = F.pad(x, torch_pads)
        with tf32(allow_tf32):
            return [conv(x, w, bias, a["strides"], pads[:n] if symmetric else 0, a["dilations"], a["group"])]

    return run


# where the depthwise kernel takes a conv, cuDNN took 2-3x its time in every fp16 MobileNetV2 layer at batch 1 and 64
# (H200, stops 47-52), and cuDNN's plans cost a cold build the most check time
DEPTHWISE = ("triton_depthwise_conv",)
register(Tactic("cudnn_conv", ("Conv",), compile_cudnn, cudnn_reason, cudnn_configs, priority=10, fresh=True,
                plans_per_shape=True, superseded_by=DEPTHWISE))
