"""QuantGemm and QuantConv through the TMA-fed quantized GEMM (kernels/int8_gemm_tma.py), Hopper only: the lowering
and epilogue of tactics/triton_int8.py, operand tiles brought in by the tensor memory accelerator (a call whose
tensors TMA cannot address runs the pointer-fed kernel with the same tile).

triton_int8_gemm_tma runs int8 layers, triton_fp8_gemm_tma fp8 e4m3 ones; both are architecture-specific."""

from __future__ import annotations

from kiln.kernels import int8_gemm_tma
from kiln.kernels.common import capability, smem_limit
from kiln.kinds.qtype import FP8, INT8
from kiln.kinds.quantized import float_out
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_gemm import _epilogue
from kiln.tactics.triton_int8 import _m, nhwc

TMA_MIN_CC = (9, 0)


def _device_reason(device) -> str | None:
    if int8_gemm_tma.TensorDescriptor is None:
        return "this triton has no tensor descriptors"
    cc = capability(device)
    if cc is not None and cc < TMA_MIN_CC:
        return f"TMA needs compute capability 9.0, the device has {cc[0]}.{cc[1]}"
    return None


def _supports(spec: LayerSpec, device) -> str | None:
    return int8_lowering.supports(spec, INT8) or _device_reason(device)


def _supports_fp8(spec: LayerSpec, device) -> str | None:
    return int8_lowering.supports(spec, FP8) or int8_lowering.fp8_device_reason(device) or _device_reason(device)


def _configs(spec: LayerSpec, device, level: int):
    w = spec.inputs[1].const
    return nhwc(spec, int8_gemm_tma.configs(_m(spec), w.shape[0], w[0].numel(), smem_limit(device)))


def _compile(spec: LayerSpec, config, device):
    form = int8_lowering.gemm_form(spec)
    w = form.w  # [N, K], K contiguous: TMA's layout
    scale, bias, out_scale, res_scale = form.scale, form.bias, spec.attrs["out_scale"], spec.attrs.get("res_scale")
    act, act_alpha, act_beta = _epilogue(spec.attrs)
    out_dtype = float_out(spec.attrs)
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(out_scale=out_scale, res_scale=res_scale, activation=act, act_alpha=act_alpha, act_beta=act_beta,
              out_dtype=out_dtype, config=config)

    def run(inputs, out=None):
        x = inputs[0]
        res = form.res_rows(inputs[4]) if has_residual else None
        return [form.back(int8_gemm_tma.matmul(form.rows(x), w, scale, bias, res, out=first(out), **kw), x)]

    return run


register(Tactic("triton_int8_gemm_tma", ("QuantGemm", "QuantConv"), _compile, _supports, _configs, priority=19,
                arch_specific=True, writes_out=True))
register(Tactic("triton_fp8_gemm_tma", ("QuantGemm", "QuantConv"), _compile, _supports_fp8, _configs, priority=19,
                arch_specific=True, writes_out=True))
