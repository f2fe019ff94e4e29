"""QuantGemm and QuantConv as one int8 GEMM: rows A [M, K] of the input times the weight W [N, K].

QuantGemm: the rows of X. A 2-D QuantConv (group 1): X in NHWC order, a 1x1 conv without padding as a
(strided) view of it, any other kernel through im2col (a strided window view copied once into [M, kh·kw·C]),
W reordered to [N, kh·kw·C]. The [M, N] result is read back as NCHW in channels_last memory, so a chain
of int8 convs stays NHWC with no copies. The combined epilogue scale x_scale·w_scale[n] is one fp32
product, as the reference rounds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from kiln.kinds.conv import resolve_pads
from kiln.tactics.common import rank
from kiln.tactics.spec import LayerSpec

ACTIVATIONS = ("none", "Relu", "Sigmoid", "Tanh", "HardSwish", "SiLU", "Gelu", "GeluTanh", "LeakyRelu", "Clip")


@dataclass
class GemmForm:
    """A quantized layer lowered to rows × Wᵀ: the int8 weight [N, K], epilogue constants, and the reshapes."""

    w: torch.Tensor                      # int8 [N, K]
    scale: torch.Tensor                  # fp32 [N]: x_scale · w_scale[n]
    bias: torch.Tensor | None            # fp32 [N]
    rows: Callable[[torch.Tensor], torch.Tensor]              # X → A [M, K] int8
    back: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (Y [M, N], X) → the layer's output
    res_rows: Callable[[torch.Tensor], torch.Tensor]          # residual → [M, N]


def supports(spec: LayerSpec) -> str | None:
    """Why the GEMM lowering cannot run `spec`, or None."""
    x, w = spec.inputs[0], spec.inputs[1]
    if x is None or x.dtype is None or x.dtype.value != "int8" or w is None or w.const is None:
        return "needs an int8 input and a constant int8 weight"
    if spec.attrs.get("activation", "none") not in ACTIVATIONS:
        return f"activation {spec.attrs.get('activation')!r} has no epilogue here"
    if len(spec.inputs) > 2 and spec.inputs[2] is not None and spec.inputs[2].const is None:
        return "w_scale is not a build-time constant"
    if len(spec.inputs) > 3 and spec.inputs[3] is not None and spec.inputs[3].const is None:
        return "bias is not a build-time constant"
    if spec.kind == "QuantConv":
        if rank(x) != 4 or not x.static:
            return "only 2-D convolutions with static shapes are lowered to GEMM"
        if spec.attrs.get("group", 1) != 1:
            return "grouped / depthwise int8 convs run on the reference (no int8 grouped GEMM yet)"
    elif rank(x) in (None, 0):
        return "input rank unknown or scalar"
    return None


def _scale(spec: LayerSpec) -> torch.Tensor:
    ws = spec.inputs[2].const.float()
    return (torch.tensor(spec.attrs["x_scale"], dtype=torch.float32, device=ws.device) * ws).contiguous()


def _bias(spec: LayerSpec) -> torch.Tensor | None:
    b = spec.inputs[3] if len(spec.inputs) > 3 else None
    return None if b is None else b.const.float().reshape(-1).contiguous()


def gemm_form(spec: LayerSpec) -> GemmForm:
    """The lowering of a layer `supports` accepted."""
    w = spec.inputs[1].const
    if spec.kind == "QuantGemm":
        n, k = w.shape
        return GemmForm(w.contiguous(), _scale(spec), _bias(spec), lambda x: x.reshape(-1, k),
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
        xp = F.pad(xh, (0, 0, pl, pr, pt, pb)) if any((pt, pl, pb, pr)) else xh
        sn, s_h, s_w, sc = xp.stride()
        win = xp.as_strided((xp.shape[0], oh, ow, kh, kw, c), (sn, s_h * sh, s_w * sw, s_h * dh, s_w * dw, sc))
        return win.reshape(-1, kh * kw * c)

    return GemmForm(w.permute(0, 2, 3, 1).reshape(m, kh * kw * c).contiguous(), _scale(spec), _bias(spec), rows,
                    lambda y, x: y.reshape(x.shape[0], oh, ow, m).permute(0, 3, 1, 2),
                    lambda r: r.permute(0, 2, 3, 1).reshape(-1, m))
