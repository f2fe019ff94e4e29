"""QuantConv (2-D, group 1) through the Triton quantized implicit-GEMM conv (kernels/int8_conv.py): no im2col copy,
scales, bias, residual (float, or quantized with res_scale), activation and requantization fused; reads any layout,
writes NHWC (timed as NHWC).
triton_int8_conv runs int8 layers, triton_fp8_conv fp8 e4m3 ones (compute capability 8.9 and later)."""

from __future__ import annotations

from kiln.kernels import int8_conv
from kiln.kernels.common import smem_limit
from kiln.kinds.conv import resolve_pads
from kiln.kinds.qtype import FP8, INT8
from kiln.kinds.quantized import float_out
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_gemm import _epilogue


def _supports(spec: LayerSpec, device) -> str | None:
    if spec.kind != "QuantConv":
        return "convolutions only"
    return int8_lowering.supports(spec, INT8)


def _supports_fp8(spec: LayerSpec, device) -> str | None:
    if spec.kind != "QuantConv":
        return "convolutions only"
    return int8_lowering.supports(spec, FP8) or int8_lowering.fp8_device_reason(device)


def _configs(spec: LayerSpec, device, level: int):
    out = spec.outputs[0].shape
    m = out[0] * out[2] * out[3] if out and all(isinstance(d, int) for d in (out[0], out[2], out[3])) else None
    co, c = spec.inputs[1].const.shape[:2]
    return [{"layout": "nhwc", **cfg} for cfg in int8_conv.configs(m, co, c, smem_limit(device), level)]


def _compile(spec: LayerSpec, config, device):
    a = spec.attrs
    form = int8_lowering.gemm_form(spec)  # its scale and bias: one fp32 product, as the reference rounds it
    w = int8_conv.pack_weight(spec.inputs[1].const)
    x_shape = spec.inputs[0].shape
    pt, pl, pb, pr = resolve_pads(tuple(x_shape[2:]), a)
    kernel, strides, dilations = tuple(spec.inputs[1].const.shape[2:]), tuple(a["strides"]), tuple(a["dilations"])
    act, act_alpha, act_beta = _epilogue(a)
    out_scale, res_scale, out_dtype = a["out_scale"], a.get("res_scale"), float_out(a)
    has_residual = int8_lowering.has_residual(spec)
    tiles = {k: config[k] for k in int8_conv.CONFIG_KEYS}

    def run(inputs, out=None):
        return [int8_conv.conv2d(inputs[0], w, form.scale, kernel, strides, [pt, pl, pb, pr], dilations, form.bias,
                                 inputs[4] if has_residual else None, out_scale=out_scale, res_scale=res_scale,
                                 activation=act, act_alpha=act_alpha, act_beta=act_beta, out_dtype=out_dtype,
                                 config=tiles, out=first(out))]

    return run


register(Tactic("triton_int8_conv", ("QuantConv",), _compile, _supports, _configs, priority=15, writes_out=True))
register(Tactic("triton_fp8_conv", ("QuantConv",), _compile, _supports_fp8, _configs, priority=15,
                arch_specific=True, writes_out=True))
