"""QuantGemm and QuantConv through the TMA-fed quantized GEMM (kernels/int8_gemm_tma.py), Hopper only: the lowering
and epilogue of tactics/triton_int8.py, operand tiles brought in by the tensor memory accelerator (a call whose
tensors TMA cannot address runs the pointer-fed kernel with the same tile). Stride-1 QuantConv also through the
TMA implicit-GEMM conv (kernels/int8_conv_tma.py: 4-D input boxes, TMA's zero fill as the padding).

triton_int8_gemm_tma / triton_int8_conv_tma run int8 layers, triton_fp8_gemm_tma / triton_fp8_conv_tma fp8 e4m3
ones; all are architecture-specific. This module holds the TMA launchers; tactics/quant_gemm.py registers the GEMM
tactics, tactics/quant_conv.py the conv ones."""

from __future__ import annotations

from kiln.kernels import int8_conv, int8_conv_tma, int8_gemm_tma
from kiln.kernels.common import smem_limit
from kiln.kinds.conv import resolve_pads
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.int8_common import gemm_rows, mark_nhwc, nhwc, out_hw, triton_epilogue_kwargs
from kiln.tactics.spec import LayerSpec


def gemm_configs(spec: LayerSpec, device, level: int):
    w = spec.inputs[1].const
    return nhwc(spec, int8_gemm_tma.configs(gemm_rows(spec), w.shape[0], w[0].numel(), smem_limit(device)))


def compile_gemm(spec: LayerSpec, config, device):
    form = int8_lowering.gemm_form(spec)
    w = form.w  # [N, K], K contiguous: TMA's layout
    scale, bias = form.scale, form.bias
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(triton_epilogue_kwargs(spec.attrs), config=config)

    def run(inputs, out=None):
        x = inputs[0]
        res = form.res_rows(inputs[4]) if has_residual else None
        return [form.back(int8_gemm_tma.matmul(form.rows(x), w, scale, bias, res, out=first(out), **kw), x)]

    return run


def conv_configs(spec: LayerSpec, device, level: int):
    (oh, ow), (co, c) = out_hw(spec), spec.inputs[1].const.shape[:2]
    return mark_nhwc(int8_conv_tma.configs(oh, ow, co, c, smem_limit(device)))


def compile_conv(spec: LayerSpec, config, device):
    a = spec.attrs
    form = int8_lowering.gemm_form(spec)
    w = int8_conv.pack_weight(spec.inputs[1].const)
    pads = list(resolve_pads(tuple(spec.inputs[0].shape[2:]), a))
    kernel, dilations = tuple(spec.inputs[1].const.shape[2:]), tuple(a["dilations"])
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(triton_epilogue_kwargs(a), config={k: config[k] for k in int8_conv_tma.CONFIG_KEYS})

    step = int8_lowering.subsample(spec) or (1, 1)  # a strided 1x1 conv: its input's subsample

    def run(inputs, out=None):
        x = inputs[0][:, :, ::step[0], ::step[1]]
        return [int8_conv_tma.conv2d(x, w, form.scale, kernel, (1, 1), pads, dilations, form.bias,
                                     inputs[4] if has_residual else None, out=first(out), **kw)]

    return run
