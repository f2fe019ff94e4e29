"""QuantGemm and QuantConv as one quantized GEMM (int8 or fp8 e4m3): rows A [M, K] of the input times W [N, K].

QuantGemm: the rows of X. A 2-D QuantConv (group 1): X in NHWC order, a 1x1 conv without padding as a
(strided) view of it, any other kernel through im2col (a strided window view copied once into [M, kh·kw·C]),
W reordered to [N, kh·kw·C]. The [M, N] result is read back as NCHW in channels_last memory, so a chain
of int8 convs stays NHWC with no copies. The combined epilogue scale x_scale·w_scale[n] is one fp32
product, as the reference rounds it; so is a quantized residual's fp32(r_q)·res_scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from kiln.kinds import qtype as qtypes
from kiln.kinds.conv import pointwise, resolve_pads
from kiln.kinds.fused import activate
from kiln.kinds.quantized import float_out, requantize
from kiln.tactics.common import rank
from kiln.tactics.spec import LayerSpec

ACTIVATIONS = ("none", "Relu", "Sigmoid", "Tanh", "HardSwish", "SiLU", "Gelu", "GeluTanh", "LeakyRelu", "Clip")
FP8_MIN_CC = (8, 9)  # fp8 tensor cores: Ada, Hopper and later


@dataclass
class GemmForm:
    """A quantized layer lowered to rows × Wᵀ: the quantized weight [N, K], epilogue constants, and the reshapes."""

    w: torch.Tensor                      # int8 or fp8 [N, K]
    scale: torch.Tensor                  # fp32 [N]: x_scale · w_scale[n]
    bias: torch.Tensor | None            # fp32 [N]
    rows: Callable[[torch.Tensor], torch.Tensor]              # X → A [M, K] of the input's type
    back: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (Y [M, N], X) → the layer's output
    res_rows: Callable[[torch.Tensor], torch.Tensor]          # residual → [M, N]


def qtype(spec: LayerSpec) -> qtypes.QType:
    """The quantized type of a QuantGemm / QuantConv spec."""
    return qtypes.of(spec.attrs)


def supports(spec: LayerSpec, want: qtypes.QType | None = None) -> str | None:
    """Why the GEMM lowering cannot run `spec` (of quantized type `want`, when given), or None."""
    x, w, qt = spec.inputs[0], spec.inputs[1], qtype(spec)
    if want is not None and qt is not want:
        return f"runs {want.label} layers only; this one is {qt.label}"
    if x is None or x.dtype is not qt.dtype or w is None or w.const is None or w.dtype is not qt.dtype:
        return f"needs a {qt.label} input and a constant {qt.label} weight"
    if spec.attrs.get("activation", "none") not in ACTIVATIONS:
        return f"activation {spec.attrs.get('activation')!r} has no epilogue here"
    if len(spec.inputs) > 2 and spec.inputs[2] is not None and spec.inputs[2].const is None:
        return "w_scale is not a build-time constant"
    if len(spec.inputs) > 3 and spec.inputs[3] is not None and spec.inputs[3].const is None:
        return "bias is not a build-time constant"
    if spec.kind == "QuantConv":
        why = residual_reason(spec)
        if why:
            return why
        if rank(x) != 4 or not x.static:
            return "only 2-D convolutions with static shapes are lowered to GEMM"
        if spec.attrs.get("group", 1) != 1:
            return f"grouped / depthwise {qt.label} convs run on the reference (no grouped quantized GEMM yet)"
    elif rank(x) in (None, 0):
        return "input rank unknown or scalar"
    return None


def has_residual(spec: LayerSpec) -> bool:
    """The spec is a QuantConv with a residual input."""
    return spec.kind == "QuantConv" and len(spec.inputs) > 4 and spec.inputs[4] is not None


def residual_reason(spec: LayerSpec) -> str | None:
    """Why a QuantConv's residual is not of the type its `res_scale` says (kinds/quantized.py), or None."""
    if not has_residual(spec):
        return None
    qt, r = qtype(spec), spec.inputs[4]
    if spec.attrs.get("res_scale") is not None:
        return None if r.dtype is qt.dtype else f"res_scale is given but the residual is {r.dtype}, not {qt.label}"
    return None if r.dtype.is_float and qtypes.of_dtype(r.dtype) is None else f"a {r.dtype} residual needs a res_scale"


def subsample(spec: LayerSpec) -> tuple[int, int] | None:
    """The strides of a strided 1x1 unpadded QuantConv, which is a stride-1 conv of its input's subsample
    x[:, :, ::sh, ::sw] (a strided view TMA can read); None for any other layer."""
    strides = tuple(spec.attrs.get("strides", (1, 1)))
    if spec.kind != "QuantConv" or not pointwise(spec.attrs, spec.inputs[1].const) or strides == (1, 1):
        return None
    return strides


def fp8_device_reason(device) -> str | None:
    """Why `device` cannot run fp8 tensor-core kernels (compute capability below 8.9), or None (also off CUDA:
    the CPU tests call the tactics directly)."""
    if getattr(device, "backend", None) != "cuda" or not torch.cuda.is_available():
        return None
    cc = torch.cuda.get_device_capability(device.torch_device)
    if cc < FP8_MIN_CC:
        return f"fp8 needs compute capability 8.9, the device has {cc[0]}.{cc[1]}"
    return None


def combined_scale(x_scale: float, w_scale: torch.Tensor) -> torch.Tensor:
    """x_scale · w_scale[n]: one fp32 product, as the reference rounds it."""
    ws = w_scale.float()
    return (torch.tensor(x_scale, dtype=torch.float32, device=ws.device) * ws).contiguous()


def _scale(spec: LayerSpec) -> torch.Tensor:
    return combined_scale(spec.attrs["x_scale"], spec.inputs[2].const)


def const_bias(spec: LayerSpec, k: int = 3) -> torch.Tensor | None:
    """Input k (a constant bias, or absent) as fp32 [N]."""
    b = spec.inputs[k] if len(spec.inputs) > k else None
    return None if b is None else b.const.float().reshape(-1).contiguous()


def gemm_form(spec: LayerSpec) -> GemmForm:
    """The lowering of a layer `supports` accepted."""
    w = spec.inputs[1].const
    if spec.kind == "QuantGemm":
        n, k = w.shape
        return GemmForm(w.contiguous(), _scale(spec), const_bias(spec), lambda x: x.reshape(-1, k),
                        lambda y, x: y.reshape(*x.shape[:-1], n), lambda r: r.reshape(-1, n))
    a = spec.attrs
    (_, c, h, wd), (m, _, kh, kw) = spec.inputs[0].shape, w.shape
    pt, pl, pb, pr = resolve_pads((h, wd), a)
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    pointwise = kh == kw == 1 and not any((pt, pl, pb, pr))

    def rows(x):
        xh = x.permute(0, 2, 3, 1)
        if pointwise:
            return xh[:, ::sh, ::sw, :].reshape(-1, c)
        xp = pad_bytes(xh, (0, 0, pl, pr, pt, pb)) if any((pt, pl, pb, pr)) else xh
        sn, s_h, s_w, sc = xp.stride()
        win = xp.as_strided((xp.shape[0], oh, ow, kh, kw, c), (sn, s_h * sh, s_w * sw, s_h * dh, s_w * dw, sc))
        return win.reshape(-1, kh * kw * c)

    return GemmForm(w.permute(0, 2, 3, 1).reshape(m, kh * kw * c).contiguous(), _scale(spec), const_bias(spec), rows,
                    lambda y, x: y.reshape(x.shape[0], oh, ow, m).permute(0, 3, 1, 2),
                    lambda r: r.permute(0, 2, 3, 1).reshape(-1, m))


def pad_bytes(t: torch.Tensor, pad: tuple[int, ...]) -> torch.Tensor:
    """F.pad with zeros of a 1-byte tensor (int8 or fp8: the zero byte is 0 / +0.0 in both), through its bytes so
    that no fp8 fill kernel is needed."""
    return F.pad(t.view(torch.uint8), pad).view(t.dtype)


def torch_epilogue(spec: LayerSpec, form: GemmForm) -> Callable[[torch.Tensor, list], torch.Tensor]:
    """The reference's epilogue in torch ops: (fp32 accumulators [M, N], the layer's inputs) → its output."""
    a = spec.attrs
    act, params, out_scale = a.get("activation", "none"), a.get("activation_params", []), a["out_scale"]
    qt = qtype(spec)
    out_dtype = float_out(a)
    residual = has_residual(spec)
    res_scale = None if a.get("res_scale") is None else form.scale.new_tensor(a["res_scale"])  # fp32, made once

    def finish(acc: torch.Tensor, inputs: list) -> torch.Tensor:
        y = acc * form.scale
        if form.bias is not None:
            y = y + form.bias
        if residual:
            r = form.res_rows(inputs[4]).float()
            y = y + (r if res_scale is None else r * res_scale)
        y = activate(y, act, params)
        return form.back(y.to(out_dtype) if out_scale is None else requantize(y, out_scale, qt), inputs[0])

    return finish
