"""Fused kinds through torch's vendor kernels: cuDNN conv / cuBLASLt GEMM with the epilogue applied by
torch's native pointwise ops (or, for convs, one Triton pass), SDPA for FusedAttention, native layer_norm for
AddLayerNorm."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kiln.ir import DType
from kiln.kernels import pointwise, quantize
from kiln.tactics import torch_conv, triton_common
from kiln.tactics.int8_lowering import fp8_device_reason
from kiln.tactics.common import attention_output, first, float_io, linear, rank, rowwise, tf32
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.torch_attention import sdpa, sdpa_configs

_ACT = {
    "none": lambda y, p: y, "Relu": lambda y, p: F.relu(y), "Sigmoid": lambda y, p: torch.sigmoid(y),
    "Tanh": lambda y, p: torch.tanh(y), "HardSwish": lambda y, p: F.hardswish(y), "SiLU": lambda y, p: F.silu(y),
    "Gelu": lambda y, p: F.gelu(y), "GeluTanh": lambda y, p: F.gelu(y, approximate="tanh"),
    "LeakyRelu": lambda y, p: F.leaky_relu(y, p[0]), "Clip": lambda y, p: torch.clamp(y, p[0], p[1]),
}
_ACT_IN_PLACE = {
    "none": lambda y, p: y, "Relu": lambda y, p: F.relu_(y), "Sigmoid": lambda y, p: y.sigmoid_(),
    "Tanh": lambda y, p: y.tanh_(), "HardSwish": lambda y, p: F.hardswish(y, inplace=True),
    "SiLU": lambda y, p: F.silu(y, inplace=True), "Gelu": lambda y, p: torch.ops.aten.gelu_(y),
    "GeluTanh": lambda y, p: torch.ops.aten.gelu_(y, approximate="tanh"),
    "LeakyRelu": lambda y, p: F.leaky_relu_(y, p[0]), "Clip": lambda y, p: y.clamp_(p[0], p[1]),
}


def _epilogue(spec: LayerSpec, in_place: bool = False):
    """The layer's activation as y → act(y); `in_place` overwrites y (a GEMM's own fresh result)."""
    fn, params = (_ACT_IN_PLACE if in_place else _ACT)[spec.attrs["activation"]], spec.attrs["activation_params"]
    return lambda y: fn(y, params)


def _supports_epilogue(spec: LayerSpec) -> str | None:
    return None if spec.attrs.get("activation") in _ACT else f"activation {spec.attrs.get('activation')!r}"


def _supports_conv(spec: LayerSpec, device) -> str | None:
    return _supports_epilogue(spec) or torch_conv.cudnn_reason(_plain(spec, 3), device)


def _plain(spec: LayerSpec, n_inputs: int) -> LayerSpec:
    """The spec without the fused extras, for the unfused tactic's checks."""
    return LayerSpec(spec.name, spec.kind, spec.attrs, spec.inputs[:n_inputs], spec.outputs[:1],
                     spec.precision, spec.tf32)


def _relu_then(spec: LayerSpec) -> float | None | bool:
    """For an activation that is ReLU followed by a min: the min's bound (None: plain ReLU); False otherwise.
    Clip(0, hi), ReLU6 among them, is ReLU then min(·, hi)."""
    a = spec.attrs
    if a["activation"] == "Relu":
        return None
    lo, hi = (list(a["activation_params"]) + [None, None])[:2] if a["activation"] == "Clip" else (None, None)
    return hi if a["activation"] == "Clip" and lo == 0.0 else False


def _conv_configs(spec: LayerSpec, device, level: int):
    """Both layouts, the epilogue by torch's ops; on a 2-D conv also the epilogue (bias, residual, activation) as
    one Triton pass after the conv, and with a ReLU (or ReLU6 / Clip(0, hi)) cuDNN's fused conv+bias(+add)+ReLU
    kernel (the bias in cuDNN's epilogue, not a pass of its own; a Clip's bound after it)."""
    plain = torch_conv.cudnn_configs(spec, device, level)
    a = spec.attrs
    n = len(a["kernel_shape"])
    configs = plain + ([dict(c, epilogue="triton") for c in plain] if n == 2 else [])
    if (_relu_then(spec) is not False and n == 2 and a["pads"][:n] == a["pads"][n:]
            and hasattr(torch, "cudnn_convolution_relu")):
        configs += [dict(c, epilogue="cudnn") for c in plain]
    return configs


def _compile_triton_epilogue(spec: LayerSpec, config, device):
    """cuDNN's conv without its bias, then bias + residual + activation in one in-place Triton pass."""
    conv = torch_conv.compile_cudnn(_plain(spec, 2), config, device)
    b = spec.inputs[2].const if len(spec.inputs) > 2 and spec.inputs[2] is not None else None
    act, alpha, beta = triton_common.epilogue(spec.attrs)
    residual = bool(spec.attrs.get("residual"))

    def run(inputs):
        y = conv(inputs[:2])[0]
        bias = b if b is not None else (inputs[2] if len(inputs) > 2 else None)
        return [pointwise.bias_act_(y, bias, inputs[3] if residual else None, act, alpha, beta)]

    return run


def _compile_cudnn_epilogue(spec: LayerSpec, config, device):
    """One cuDNN call: relu(conv(x, w) + bias (+ r)), then min(·, hi) in place for Clip(0, hi)."""
    a = spec.attrs
    fmt = torch.channels_last if config.get("layout") == "nhwc" else torch.contiguous_format
    w = spec.inputs[1].const.contiguous(memory_format=fmt)
    b = spec.inputs[2].const if len(spec.inputs) > 2 and spec.inputs[2] is not None else None
    stride, pad, dil, groups, allow = a["strides"], a["pads"][:2], a["dilations"], a["group"], spec.tf32
    residual, hi = bool(a.get("residual")), _relu_then(spec)

    def run(inputs):
        x = inputs[0].contiguous(memory_format=fmt)
        bias = b if b is not None else (inputs[2] if len(inputs) > 2 else None)
        with tf32(allow):
            if residual:
                z = inputs[3].contiguous(memory_format=fmt)
                y = torch.cudnn_convolution_add_relu(x, w, z, 1.0, bias, stride, pad, dil, groups)
            else:
                y = torch.cudnn_convolution_relu(x, w, bias, stride, pad, dil, groups)
        return [y if hi is None else y.clamp_max_(hi)]

    return run


def _compile_conv(spec: LayerSpec, config, device):
    if config.get("epilogue") == "cudnn":
        return _compile_cudnn_epilogue(spec, config, device)
    if config.get("epilogue") == "triton":
        return _compile_triton_epilogue(spec, config, device)
    conv = torch_conv.compile_cudnn(_plain(spec, 3), config, device)
    act, residual = _epilogue(spec), bool(spec.attrs.get("residual"))

    def run(inputs):
        y = conv(inputs[:3])[0]
        if residual:
            y = y + inputs[3]
        return [act(y)]

    return run


def _supports_gemm(spec: LayerSpec, device) -> str | None:
    if spec.inputs[1] is None or spec.inputs[1].const is None or rank(spec.inputs[1]) != 2:
        return "weight is not a constant 2-D tensor"
    return _supports_epilogue(spec) or float_io(spec)


def _gemm_configs(spec: LayerSpec, device, level: int):
    """The activation after cuBLASLt's bias epilogue; for GELU in fp16 / bf16 also cuBLASLt's GELU+bias epilogue,
    which is the tanh approximation: within 4.8e-4 of the exact (erf) GELU, under the tolerance of fp16 outputs."""
    configs = [{}]
    if spec.attrs["activation"] in ("Gelu", "GeluTanh") and spec.inputs[0].dtype in (DType.FLOAT16, DType.BFLOAT16):
        configs.append({"epilogue": "gelu"})
    return configs


def _compile_gemm(spec: LayerSpec, config, device):
    w = spec.inputs[1].const
    w = (w if spec.attrs["trans_b"] else w.t()).contiguous()  # [N, K]
    b = spec.inputs[2].const if len(spec.inputs) > 2 and spec.inputs[2] is not None else None
    act_, allow = _epilogue(spec, in_place=True), spec.tf32
    if config.get("epilogue") == "gelu":
        zero = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)

        def run_gelu(inputs, out=None):
            bias = b if b is not None else (inputs[2] if len(inputs) > 2 else zero)
            return [rowwise(lambda x: linear(x, w, bias.reshape(-1), first(out), gelu=True), inputs[0])]

        return run_gelu

    def run(inputs, out=None):
        bias = b if b is not None else (inputs[2] if len(inputs) > 2 else None)
        with tf32(allow):
            return [rowwise(lambda x: act_(linear(x, w, bias, first(out))), inputs[0])]

    return run


def _supports_attention(spec: LayerSpec, device) -> str | None:
    q, kt, v = spec.inputs[:3]
    if rank(q) not in (3, 4) or rank(kt) != rank(q) or rank(v) != rank(q):
        return "Q, Kᵀ and V must all be 3-D or 4-D"
    if q.shape[:-2] != kt.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        return "batch/head dims of Q, Kᵀ and V differ"
    out, why = attention_output(spec)
    mask = spec.inputs[3] if len(spec.inputs) > 3 else None
    io = [q, kt, v, out] + ([mask] if mask is not None and mask.dtype.is_float else [])  # else a keep mask
    if why or len({x.dtype for x in io}) != 1:
        return why or "Q, Kᵀ, V, mask and Y dtypes differ"
    return float_io(LayerSpec(spec.name, spec.kind, {}, tuple(io), (out,)))


def _compile_attention(spec: LayerSpec, config, device):
    d = spec.inputs[0].shape[-1]
    scale = spec.attrs["scale"] if spec.attrs["scale"] is not None else 1.0 / math.sqrt(d)
    q_scale, fill = spec.attrs.get("q_scale"), spec.attrs.get("mask_fill")

    def run(inputs):
        q, kt, v = inputs[:3]
        mask = inputs[3] if len(inputs) > 3 else None
        if mask is not None and not mask.dtype.is_floating_point:  # a keep mask (kinds/fused.py)
            mask = mask != 0 if fill is None else torch.where(mask != 0, 0.0, fill).to(q.dtype)
        y = sdpa(config, q, kt.transpose(-1, -2), v, attn_mask=mask, scale=scale)
        return [y if q_scale is None else quantize.quantize(y, q_scale)]

    return run


def _supports_add_ln(spec: LayerSpec, device) -> str | None:
    a = spec.inputs[0]
    if a is None or a.shape is None or spec.inputs[1] is None or spec.inputs[1].shape != a.shape:
        return "A and B shapes differ or are unknown"
    axis = spec.attrs.get("axis", -1) % len(a.shape)
    if not all(isinstance(x, int) for x in a.shape[axis:]):
        return "normalized dims are not static"
    if spec.attrs.get("q_scale") is not None and spec.attrs["q_dtype"] is DType.FP8E4M3:
        return fp8_device_reason(device) or float_io(LayerSpec(spec.name, spec.kind, {}, spec.inputs[:2],
                                                                spec.outputs[:1]))
    return float_io(LayerSpec(spec.name, spec.kind, {}, spec.inputs[:2], spec.outputs[:1]))


def _compile_add_ln(spec: LayerSpec, config, device):
    a = spec.inputs[0]
    shape = tuple(a.shape[spec.attrs.get("axis", -1) % len(a.shape):])
    eps = spec.attrs.get("epsilon", 1e-5)

    q_scale, q_dtype = spec.attrs.get("q_scale"), spec.attrs.get("q_dtype")

    def run(inputs):
        s = inputs[0] + inputs[1]
        y = F.layer_norm(s, shape, inputs[2], inputs[3] if len(inputs) > 3 else None, eps)
        if q_scale is None:
            return [y, s]
        q_in = y * inputs[4].to(y.dtype) if len(inputs) > 4 and inputs[4] is not None else y
        return [y, s, quantize.quantize(q_in, q_scale, dtype=q_dtype.torch)]

    return run


register(Tactic("cudnn_fused_conv", ("FusedConv",), _compile_conv, _supports_conv, _conv_configs, priority=10,
                fresh=True, plans_per_shape=True, superseded_by=torch_conv.DEPTHWISE))
register(Tactic("cublaslt_fused_gemm", ("FusedGemm",), _compile_gemm, _supports_gemm, _gemm_configs, priority=10,
                writes_out=True))
register(Tactic("sdpa_fused_attention", ("FusedAttention",), _compile_attention, _supports_attention,
                sdpa_configs, priority=10, fresh=True))
register(Tactic("torch_add_layernorm", ("AddLayerNorm",), _compile_add_ln, _supports_add_ln, priority=10, fresh=True))
