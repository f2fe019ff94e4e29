"""Reference implementations of kiln's int8 layer kinds, QuantConv and QuantGemm (DESIGN.md part 4).

Scheme: weights symmetric int8 per output channel (w ≈ w_q · w_scale[c]), activations symmetric
int8 per tensor (x ≈ x_q · x_scale), zero points 0, integer range [-127, 127]. Bit-exact semantics:

    acc  = Σ x_q · w_q                       int32 accumulate (exact; builds keep K·127² < 2³¹)
    y    = fp32(acc) · fp32(x_scale · w_scale[c])   the combined scale is one fp32 product, rounded once
    y    = y + bias[c] (fp32), + residual (as fp32), then the epilogue activation (kinds/fused.py), in fp32
    out  = y, rounded to `out_dtype` (fp32 unless given: fp16 when its readers are fp16)   when `out_scale` is None
    out  = int8(clamp(round_half_even(y / out_scale), -127, 127))   when the reader reads int8

fp32(acc) rounds to nearest even (exact below 2²⁴). The integer sum is computed in float64 here,
which is exact for any order of summation (every partial sum is an integer below 2⁵³).
"""

from __future__ import annotations

import torch

from kiln.kinds.conv import conv_nd
from kiln.kinds.fused import activate
from kiln.kinds.registry import kind

QMAX = 127


def requantize(y: torch.Tensor, out_scale: float) -> torch.Tensor:
    """fp32 → int8: round half to even of y / out_scale (an fp32 division), saturated to [-127, 127]."""
    q = torch.round(y.float() / torch.tensor(out_scale, dtype=torch.float32, device=y.device))
    return q.clamp(-QMAX, QMAX).to(torch.int8)


def epilogue(acc: torch.Tensor, w_scale: torch.Tensor, bias, residual, channel_axis: int, attrs) -> torch.Tensor:
    """int32 accumulators → the layer's output: scale, bias, residual, activation, optional requantize."""
    shape = [1] * acc.dim()
    shape[channel_axis] = -1
    scale = torch.tensor(attrs["x_scale"], dtype=torch.float32, device=acc.device) * w_scale.float()
    y = acc.to(torch.int32).float() * scale.reshape(shape)
    if bias is not None:
        y = y + bias.float().reshape(shape)
    if residual is not None:
        y = y + residual.float()
    y = activate(y, attrs["activation"], attrs["activation_params"])
    if attrs.get("out_scale") is not None:
        return requantize(y, attrs["out_scale"])
    return y.to(float_out(attrs))


def float_out(attrs) -> torch.dtype:
    """The torch dtype of a quantized layer's float output (attribute `out_dtype`, fp32 when absent)."""
    dt = attrs.get("out_dtype")
    return torch.float32 if dt is None else dt.torch


@kind("QuantConv")
def quant_conv(inputs, attrs):
    """Inputs: X_q int8 [N, C, ...], W_q int8 [M, C/group, ...], w_scale fp32 [M], optional bias fp32 [M],
    optional residual (float, the output's shape). attrs: Conv's, x_scale, out_scale (None: float out of type
    out_dtype, fp32 when absent), activation, activation_params."""
    x, w, w_scale, b, r = (list(inputs) + [None] * 5)[:5]
    acc = conv_nd(x.double(), w.double(), None, attrs)
    return epilogue(acc, w_scale, b, r, 1, attrs)


@kind("QuantGemm")
def quant_gemm(inputs, attrs):
    """Inputs: X_q int8 [..., K], W_q int8 [N, K], w_scale fp32 [N], optional bias fp32 [N].
    attrs: x_scale, out_scale (None: float out of type out_dtype, fp32 when absent), activation, activation_params."""
    x, w, w_scale, b = (list(inputs) + [None] * 4)[:4]
    acc = torch.matmul(x.double(), w.double().t())
    return epilogue(acc, w_scale, b, None, -1, attrs)
