"""QuantGemm and QuantConv through the TMA-fed quantized GEMM (kernels/int8_gemm_tma.py), Hopper only: the lowering
and epilogue of tactics/triton_int8.py, operand tiles brought in by the tensor memory accelerator (a call whose
tensors TMA cannot address runs the pointer-fed kernel with the same tile). Stride-1 QuantConv also through the
TMA implicit-GEMM conv (kernels/int8_conv_tma.py: 4-D input boxes, TMA's zero fill as the padding).

triton_int8_gemm_tma / triton_int8_conv_tma run int8 layers, triton_fp8_gemm_tma / triton_fp8_conv_tma fp8 e4m3
ones; all are architecture-specific."""

from __future__ import annotations

from kiln.kernels import int8_conv, int8_conv_tma, int8_gemm_tma
from kiln.kernels.common import capability, smem_limit
from kiln.kinds.conv import resolve_pads
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


def _conv_reason(spec: LayerSpec) -> str | None:
    a, w = spec.attrs, spec.inputs[1].const
    if spec.kind != "QuantConv" or w is None or w.dim() != 4:
        return "2-D convolutions only"
    if (tuple(a.get("strides", (1, 1))) != (1, 1) and not int8_lowering.subsample(spec)) or a.get("group", 1) != 1:
        return "group 1, stride 1 (or a strided 1x1 unpadded conv: a subsample) only"
    if not int8_conv_tma.addressable(w.shape[1], w.shape[2] * w.shape[3]):
        return "input channels not a multiple of 16 (TMA's 16-byte strides)"
    return None


def _conv_configs(spec: LayerSpec, device, level: int):
    out, (co, c) = spec.outputs[0].shape, spec.inputs[1].const.shape[:2]
    oh, ow = (d if isinstance(d, int) else None for d in (out or (None,) * 4)[2:])
    return [{"layout": "nhwc", **cfg} for cfg in int8_conv_tma.configs(oh, ow, co, c, smem_limit(device))]


def _compile_conv(spec: LayerSpec, config, device):
    a = spec.attrs
    form = int8_lowering.gemm_form(spec)
    w = int8_conv.pack_weight(spec.inputs[1].const)
    pads = list(resolve_pads(tuple(spec.inputs[0].shape[2:]), a))
    kernel, dilations = tuple(spec.inputs[1].const.shape[2:]), tuple(a["dilations"])
    act, act_alpha, act_beta = _epilogue(a)
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(out_scale=a["out_scale"], res_scale=a.get("res_scale"), activation=act, act_alpha=act_alpha,
              act_beta=act_beta, out_dtype=float_out(a), config={k: config[k] for k in int8_conv_tma.CONFIG_KEYS})

    step = int8_lowering.subsample(spec) or (1, 1)  # a strided 1x1 conv: its input's subsample

    def run(inputs, out=None):
        x = inputs[0][:, :, ::step[0], ::step[1]]
        return [int8_conv_tma.conv2d(x, w, form.scale, kernel, (1, 1), pads, dilations, form.bias,
                                     inputs[4] if has_residual else None, out=first(out), **kw)]

    return run


register(Tactic("triton_int8_conv_tma", ("QuantConv",), _compile_conv,
                lambda spec, device: _conv_reason(spec) or _supports(spec, device), _conv_configs, priority=19,
                arch_specific=True, writes_out=True))
register(Tactic("triton_fp8_conv_tma", ("QuantConv",), _compile_conv,
                lambda spec, device: _conv_reason(spec) or _supports_fp8(spec, device), _conv_configs, priority=19,
                arch_specific=True, writes_out=True))
