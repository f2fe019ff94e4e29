"""Reference implementations of kiln's quantized layer kinds, QuantConv and QuantGemm (DESIGN.md part 4).

Scheme: weights symmetric per output channel (w ≈ w_q · w_scale[c]), activations symmetric per tensor
(x ≈ x_q · x_scale), zero points 0; the attribute `qtype` (kinds/qtype.py) names the quantized type: int8
(absent: integer range [-127, 127]) or fp8e4m3 (e4m3fn values, ±448). Semantics:

    acc  = Σ x_q · w_q      int8: int32 accumulate (exact; builds keep K·127² < 2³¹)
                            fp8: exact products summed in float64, rounded once to fp32 (GPU tensor cores
                            accumulate in fp32 or less, so GPU results are compared with a tolerance)
    y    = fp32(acc) · fp32(x_scale · w_scale[c])   the combined scale is one fp32 product, rounded once
    y    = y + bias[c] (fp32), + residual, then the epilogue activation (kinds/fused.py), in fp32; the residual
           (QuantConv only) is float, read as fp32, when `res_scale` is None or absent, else of the quantized type
           and added as fp32(r_q) · fp32(res_scale): one fp32 product, rounded once, then the fp32 add
    out  = y, rounded to `out_dtype` (fp32 unless given: fp16 when its readers are fp16)   when `out_scale` is None
    out  = qtype(y · inv)   when the reader reads the quantized type, inv = fp32(1 / out_scale) (`inv_scale`,
           made once per layer): one fp32 product, then int8: clamp(round_half_even(·), -127, 127); fp8: the
           nearest e4m3 value (ties to even), saturated to ±448. A product, not a division: an IEEE division
           per element made the GPU kernels up to 3.7x slower; the two differ by at most one fp32 ulp before rounding

fp32(acc) rounds to nearest even (exact below 2²⁴ for int8). The float64 sums are exact in any order: int8
partial sums are integers below 2⁵³; fp8 products have 8-bit significands within [2⁻¹⁸, 2¹⁸), exact for K ≤ 2¹⁷.
"""

from __future__ import annotations

import numpy as np
import torch

from kiln.kinds import qtype as qtypes
from kiln.kinds.conv import conv_nd
from kiln.kinds.fused import activate
from kiln.kinds.registry import DTYPE, FLOAT, INT, INTS, NONE, STR, kind, list_of

QMAX = 127
# the quantized layer kinds (weights of the quantized type)
KINDS = ("QuantConv", "QuantGemm", "QuantConvPair", "QuantConvChain")


def inv_scale(out_scale: float) -> float:
    """fp32(1 / out_scale): the fp32 division rounded once, the factor every requantizing epilogue multiplies by."""
    return float(np.float32(1.0) / np.float32(out_scale))


def requantize(y: torch.Tensor, out_scale: float, qtype: qtypes.QType = qtypes.INT8) -> torch.Tensor:
    """fp32 → `qtype`: y · inv_scale(out_scale) (one fp32 product) rounded to nearest even and saturated
    (kinds/qtype.py)."""
    return qtype.quantize(y.float() * torch.tensor(inv_scale(out_scale), dtype=torch.float32, device=y.device))


def epilogue(acc: torch.Tensor, w_scale: torch.Tensor, bias, residual, channel_axis: int, attrs) -> torch.Tensor:
    """Accumulators (float64) → the layer's output: scale, bias, residual (dequantized when `res_scale` is
    given), activation, optional requantize."""
    y = scaled(acc, w_scale, bias, attrs["x_scale"], channel_axis, qtypes.of(attrs))
    if residual is not None:
        y = y + residual_fp32(residual, attrs.get("res_scale"))
    return finish(y, attrs)


def scaled(acc: torch.Tensor, w_scale: torch.Tensor, bias, x_scale: float, channel_axis: int,
           qtype: qtypes.QType) -> torch.Tensor:
    """fp32(acc) · fp32(x_scale · w_scale[c]) (+ bias[c]): a quantized conv or GEMM's fp32 value before the rest
    of its epilogue."""
    shape = [1] * acc.dim()
    shape[channel_axis] = -1
    scale = torch.tensor(x_scale, dtype=torch.float32, device=acc.device) * w_scale.float()
    y = (acc.to(torch.int32) if qtype.integer else acc).float() * scale.reshape(shape)
    return y if bias is None else y + bias.float().reshape(shape)


def finish(y: torch.Tensor, attrs) -> torch.Tensor:
    """The epilogue's activation, then the requantized (`out_scale`) or float output."""
    y = activate(y, attrs["activation"], attrs["activation_params"])
    if attrs.get("out_scale") is not None:
        return requantize(y, attrs["out_scale"], qtypes.of(attrs))
    return y.to(float_out(attrs))


def residual_fp32(r: torch.Tensor, res_scale: float | None) -> torch.Tensor:
    """A QuantConv residual as the fp32 value its epilogue adds: a float one as it is, a quantized one (int8 or
    fp8 e4m3, `res_scale` given) as fp32(r_q) · fp32(res_scale), one fp32 product."""
    if res_scale is None:
        return r.float()
    return r.float() * torch.tensor(res_scale, dtype=torch.float32, device=r.device)


def float_out(attrs) -> torch.dtype:
    """The torch dtype of a quantized layer's float output (attribute `out_dtype`, fp32 when absent)."""
    dt = attrs.get("out_dtype")
    return torch.float32 if dt is None else dt.torch


@kind("QuantConv", attrs={"activation": STR.req, "activation_params": list_of(FLOAT | NONE).req, "auto_pad": STR,
                          "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS.req, "out_dtype": DTYPE,
                          "out_scale": FLOAT | NONE, "pads": INTS.req, "qtype": STR, "res_scale": FLOAT | NONE,
                          "strides": INTS.req, "x_scale": FLOAT.req})
def quant_conv(inputs, attrs):
    """Inputs: X_q [N, C, ...], W_q [M, C/group, ...] (int8, or fp8 e4m3 with qtype fp8e4m3), w_scale fp32 [M],
    optional bias fp32 [M], optional residual (the output's shape: float, or of the quantized type when
    `res_scale` is given). attrs: Conv's, qtype, x_scale, out_scale (None: float out of type out_dtype, fp32 when
    absent), res_scale (optional), activation, activation_params."""
    x, w, w_scale, b, r = (list(inputs) + [None] * 5)[:5]
    acc = conv_nd(x.double(), w.double(), None, attrs)
    return epilogue(acc, w_scale, b, r, 1, attrs)


@kind("QuantConvPair", attrs={"activation": STR.req, "activation_params": list_of(FLOAT | NONE).req, "auto_pad": STR,
                              "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS.req, "out_dtype": DTYPE,
                              "out_scale": FLOAT | NONE, "pads": INTS.req, "qtype": STR, "strides": INTS.req,
                              "strides2": INTS.req, "x2_scale": FLOAT.req, "x_scale": FLOAT.req})
def quant_conv_pair(inputs, attrs):
    """Two quantized convs of one output shape summed under one epilogue (a bottleneck's last conv and its
    downsample, quant/fuse_conv_pair.py): inputs X_q, W_q, w_scale, bias as QuantConv's, then X2_q, W2_q, w2_scale,
    bias2 of the second conv (attrs x2_scale, strides2; its other Conv attributes the first's). No residual:
    y = (fp32(acc)·scale + bias) + (fp32(acc2)·scale2 + bias2), each as QuantConv's, then activation and output."""
    x, w, w_scale, b, x2, w2, w2_scale, b2 = (list(inputs) + [None] * 8)[:8]
    qtype = qtypes.of(attrs)
    y = scaled(conv_nd(x.double(), w.double(), None, attrs), w_scale, b, attrs["x_scale"], 1, qtype)
    acc2 = conv_nd(x2.double(), w2.double(), None, dict(attrs, strides=attrs["strides2"]))
    return finish(y + scaled(acc2, w2_scale, b2, attrs["x2_scale"], 1, qtype), attrs)


@kind("QuantConvChain", attrs={"activation": STR.req, "activation2": STR.req,
                               "activation2_params": list_of(FLOAT | NONE).req,
                               "activation_params": list_of(FLOAT | NONE).req, "auto_pad": STR, "dilations": INTS.req,
                               "group": INT.req, "kernel_shape": INTS.req, "out2_scale": FLOAT | NONE,
                               "out_dtype": DTYPE, "out_scale": FLOAT | NONE, "pads": INTS.req, "qtype": STR,
                               "res_scale": FLOAT | NONE, "strides": INTS.req, "strides2": INTS, "x2_scale": FLOAT,
                               "x_scale": FLOAT.req})
def quant_conv_chain(inputs, attrs):
    """A quantized conv and the 1x1 quantized conv that reads its output, as one layer with both outputs (a
    bottleneck's last conv and the next block's first, quant/fuse_conv_chain.py): inputs X_q, W_q, w_scale, bias,
    residual as QuantConv's (attrs its own), then W2_q, w2_scale, bias2 of the second conv, which reads the first's
    output at x_scale = out_scale and has out2_scale, activation2, activation2_params; the first may instead be a
    QuantConvPair, its second conv's X2_q, W2_q, w2_scale, bias2 then inputs 8-11 (attrs x2_scale, strides2) and no
    residual. Outputs (y, z)."""
    pair = len(inputs) > 8 and inputs[8] is not None
    y = quant_conv_pair(inputs[:4] + list(inputs[8:12]), attrs) if pair else quant_conv(inputs[:5], attrs)
    return y, quant_conv([y, *inputs[5:8]], second_attrs(attrs))


def second_attrs(attrs) -> dict:
    """A QuantConvChain's second conv as QuantConv attributes: 1x1, stride 1, unpadded, reading the first's output."""
    drop = ("res_scale", "out2_scale", "activation2", "activation2_params", "x2_scale", "strides2")
    return {k: v for k, v in attrs.items() if k not in drop} \
        | {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1, "auto_pad": "NOTSET",
           "kernel_shape": [1, 1], "x_scale": attrs["out_scale"], "out_scale": attrs["out2_scale"],
           "activation": attrs["activation2"], "activation_params": attrs["activation2_params"]}


@kind("QuantGemm", attrs={"activation": STR.req, "activation_params": list_of(FLOAT | NONE).req, "out_dtype": DTYPE,
                          "out_scale": FLOAT | NONE, "qtype": STR, "x_scale": FLOAT.req})
def quant_gemm(inputs, attrs):
    """Inputs: X_q [..., K], W_q [N, K] (int8, or fp8 e4m3 with qtype fp8e4m3), w_scale fp32 [N], optional bias
    fp32 [N]. attrs: qtype, x_scale, out_scale (None: float out of type out_dtype, fp32 when absent), activation,
    activation_params."""
    x, w, w_scale, b = (list(inputs) + [None] * 4)[:4]
    acc = torch.matmul(x.double(), w.double().t())
    return epilogue(acc, w_scale, b, None, -1, attrs)
