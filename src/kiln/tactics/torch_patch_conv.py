"""A patch convolution (2-D, kernel = stride, no padding: ViT's patch embedding, and every 1×1 conv) as one GEMM: the
image cut into patches (one copy, none for a channels_last 1×1) times the flattened weights, bias in cuBLASLt's
epilogue. cuDNN ran ViT-B/16's 16×16 stride-16 conv at batch 64 in 0.5 ms on an H200, over twenty times its FLOPs'
time; this GEMM took 0.064 ms."""

from __future__ import annotations

from kiln.tactics.common import float_io, linear, rank, tf32
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec


def _supports(spec: LayerSpec, device) -> str | None:
    a = spec.attrs
    if spec.inputs[1] is None or spec.inputs[1].const is None:
        return "weights are not a build-time constant"
    if rank(spec.inputs[0]) != 4 or len(a.get("kernel_shape", ())) != 2:
        return "only 2-D convolutions"
    if list(a["strides"]) != list(a["kernel_shape"]) or any(a["pads"]) or any(d != 1 for d in a["dilations"]):
        return "only patch convolutions (stride = kernel, no padding or dilation)"
    if a["group"] != 1 or a.get("auto_pad", "NOTSET") != "NOTSET":
        return "grouped convolutions and auto_pad are not patch GEMMs"
    return float_io(spec)


def _configs(spec: LayerSpec, device, level: int):
    """The output in NCHW memory (one more copy) or NHWC (the GEMM's own rows, channels_last)."""
    return [{"layout": "nchw"}, {"layout": "nhwc"}]


def _compile(spec: LayerSpec, config, device):
    weight = spec.inputs[1].const
    out_ch, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
    w = weight.reshape(out_ch, -1).contiguous()  # [O, C·kh·kw], the patches' element order
    b = spec.inputs[2].const if len(spec.inputs) > 2 and spec.inputs[2] is not None else None
    nchw, allow = config.get("layout") == "nchw", spec.tf32

    def run(inputs):
        x = inputs[0]
        n, c, h, wd = x.shape
        ph, pw = h // kh, wd // kw
        patches = (x[:, :, :ph * kh, :pw * kw].reshape(n, c, ph, kh, pw, kw).permute(0, 2, 4, 1, 3, 5)
                   .reshape(n * ph * pw, c * kh * kw))
        bias = b if b is not None else (inputs[2] if len(inputs) > 2 else None)
        with tf32(allow):
            y = linear(patches, w, bias, None).view(n, ph, pw, out_ch).permute(0, 3, 1, 2)
        return [y.contiguous() if nchw else y]

    return run

register(Tactic("cublas_patch_conv", ("Conv",), _compile, _supports, _configs, priority=20, fresh=True))
