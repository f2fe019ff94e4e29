"""QuantGemm and QuantConv through the Triton quantized GEMM (kernels/int8_gemm.py): scales, bias, residual (float,
or quantized with res_scale), activation and requantization fused into the GEMM's epilogue; tile configs pruned by
shared memory.

One kernel, two tactics: triton_int8_gemm for int8 layers, triton_fp8_gemm for fp8 e4m3 layers (compute
capability 8.9 and later; architecture-specific, so --hardware-compat portable builds leave it out)."""

from __future__ import annotations

from kiln.kernels import int8_gemm
from kiln.kernels.common import smem_limit
from kiln.kinds.qtype import FP8, INT8
from kiln.kinds.quantized import float_out
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import rows
from kiln.tactics.triton_gemm import _epilogue


def _m(spec: LayerSpec) -> int | None:
    x = spec.inputs[0]
    if spec.kind == "QuantGemm":
        return rows(x)
    out = spec.outputs[0].shape
    return out[0] * out[2] * out[3] if out and all(isinstance(d, int) for d in out) else None


def nhwc(spec: LayerSpec, configs: list[dict]) -> list[dict]:
    """A conv's GEMM configs marked NHWC: its rows are a view of channels_last input (no im2col copy for a
    1x1), so the autotuner times it on the input its NHWC neighbours write."""
    return [{"layout": "nhwc", **c} for c in configs] if spec.kind == "QuantConv" else configs


def _configs(spec: LayerSpec, device, level: int):
    w = spec.inputs[1].const
    return nhwc(spec, int8_gemm.configs(_m(spec), w.shape[0], w[0].numel(), smem_limit(device), level))


def _compile(spec: LayerSpec, config, device):
    form = int8_lowering.gemm_form(spec)
    w = form.w.t()  # (K, N) view of the [N, K] weight
    scale, bias, out_scale, res_scale = form.scale, form.bias, spec.attrs["out_scale"], spec.attrs.get("res_scale")
    act, act_alpha, act_beta = _epilogue(spec.attrs)
    out_dtype = float_out(spec.attrs)
    has_residual = int8_lowering.has_residual(spec)

    def run(inputs, out=None):
        x = inputs[0]
        res = form.res_rows(inputs[4]) if has_residual else None
        y = int8_gemm.matmul(form.rows(x), w, scale, bias, res, out_scale=out_scale, res_scale=res_scale,
                             activation=act, act_alpha=act_alpha, act_beta=act_beta, out_dtype=out_dtype,
                             config=config, out=first(out))
        return [form.back(y, x)]

    return run


def _supports(spec: LayerSpec, device) -> str | None:
    return int8_lowering.supports(spec, INT8)


def _supports_fp8(spec: LayerSpec, device) -> str | None:
    return int8_lowering.supports(spec, FP8) or int8_lowering.fp8_device_reason(device)


register(Tactic("triton_int8_gemm", ("QuantGemm", "QuantConv"), _compile, _supports, _configs, priority=20,
                writes_out=True))
register(Tactic("triton_fp8_gemm", ("QuantGemm", "QuantConv"), _compile, _supports_fp8, _configs, priority=20,
                arch_specific=True, writes_out=True))
