"""QuantGemm and QuantConv through the Triton quantized GEMM (kernels/int8_gemm.py): scales, bias, residual (float,
or quantized with res_scale), activation and requantization fused into the GEMM's epilogue; tile configs pruned by
shared memory.

One kernel, two tactics: triton_int8_gemm for int8 layers, triton_fp8_gemm for fp8 e4m3 layers (compute
capability 8.9 and later; architecture-specific, so --hardware-compat portable builds leave it out). This module holds
the launcher; tactics/quant_gemm.py registers them (and tactics/quant_conv.py lists them)."""

from __future__ import annotations

from kiln.kernels import int8_gemm
from kiln.kernels.common import smem_limit
from kiln.kinds.conv import pointwise
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.int8_common import gemm_rows, nhwc, triton_epilogue_kwargs
from kiln.tactics.spec import LayerSpec


OUTPACED_MACS = 1 << 28  # multiply-adds from which a 1x1 conv's GEMM trails the Gluon GEMM (batch-1 ones are ~2^26)


def outpaced(spec: LayerSpec) -> bool:
    """Where the Hopper GEMM and convs (Gluon) take a layer, whether this kernel trails them: on convs through im2col
    (1.3-24x the best in ResNet-50 int8 at batch 1-256) and on GEMMs of OUTPACED_MACS or more (1.25-2.1x at batch
    64-256, H200). At batch 1 it led some 1x1 convs by up to 20 % (H100), so those stay tried."""
    w, rows = spec.inputs[1].const, gemm_rows(spec)
    if spec.kind == "QuantConv" and not pointwise(spec.attrs, w):
        return True
    return rows is not None and rows * w.shape[0] * w[0].numel() >= OUTPACED_MACS


def gemm_configs(spec: LayerSpec, device, level: int):
    w = spec.inputs[1].const
    return nhwc(spec, int8_gemm.configs(gemm_rows(spec), w.shape[0], w[0].numel(), smem_limit(device), level))


def compile_gemm(spec: LayerSpec, config, device):
    form = int8_lowering.gemm_form(spec)
    w = form.w.t()  # (K, N) view of the [N, K] weight
    scale, bias = form.scale, form.bias
    kw = triton_epilogue_kwargs(spec.attrs)
    has_residual = int8_lowering.has_residual(spec)

    def run(inputs, out=None):
        x = inputs[0]
        res = form.res_rows(inputs[4]) if has_residual else None
        y = int8_gemm.matmul(form.rows(x), w, scale, bias, res, config=config, out=first(out), **kw)
        return [form.back(y, x)]

    return run
