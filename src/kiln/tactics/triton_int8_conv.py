"""QuantConv (2-D, group 1) through the Triton quantized implicit-GEMM conv (kernels/int8_conv.py): no im2col copy,
scales, bias, residual (float, or quantized with res_scale), activation and requantization fused; reads any layout,
writes NHWC (timed as NHWC).
triton_int8_conv runs int8 layers, triton_fp8_conv fp8 e4m3 ones (compute capability 8.9 and later), both
registered by tactics/quant_conv.py."""

from __future__ import annotations

from kiln.kernels import int8_conv
from kiln.kernels.common import smem_limit
from kiln.kinds.conv import resolve_pads
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.int8_common import triton_epilogue_kwargs
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import conv_rows, mark_nhwc


def conv_only(spec: LayerSpec) -> str | None:
    return None if spec.kind == "QuantConv" else "convolutions only"


def conv_configs(spec: LayerSpec, device, level: int):
    co, c = spec.inputs[1].const.shape[:2]
    return mark_nhwc(int8_conv.configs(conv_rows(spec.outputs[0].shape), co, c, smem_limit(device), level))


def compile_conv(spec: LayerSpec, config, device):
    a = spec.attrs
    form = int8_lowering.gemm_form(spec)  # its scale and bias: one fp32 product, as the reference rounds it
    w = int8_conv.pack_weight(spec.inputs[1].const)
    x_shape = spec.inputs[0].shape
    pt, pl, pb, pr = resolve_pads(tuple(x_shape[2:]), a)
    kernel, strides, dilations = tuple(spec.inputs[1].const.shape[2:]), tuple(a["strides"]), tuple(a["dilations"])
    kw = triton_epilogue_kwargs(a)
    has_residual = int8_lowering.has_residual(spec)
    tiles = {k: config[k] for k in int8_conv.CONFIG_KEYS}

    def run(inputs, out=None):
        return [int8_conv.conv2d(inputs[0], w, form.scale, kernel, strides, [pt, pl, pb, pr], dilations, form.bias,
                                 inputs[4] if has_residual else None, config=tiles, out=first(out), **kw)]

    return run
