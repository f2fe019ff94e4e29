"""What the Triton tactics share: one float dtype across the values a kernel touches and the device's support, the
fused epilogue's activation spec, the GEMM rows of a value or a conv's output, the NHWC config mark, the checks every
Triton conv tactic makes."""

from __future__ import annotations

import math

from kiln.kernels.common import dtype_reason
from kiln.tactics.common import float_io, rank
from kiln.tactics.spec import LayerSpec, ValueSpec


def io_reason(spec: LayerSpec, values: list[ValueSpec | None], device) -> str | None:
    """None if `values` (inputs..., output last) share one fp32/fp16/bf16 dtype the device runs, else why not."""
    sub = LayerSpec(spec.name, spec.kind, {}, tuple(values[:-1]), (values[-1],))
    return float_io(sub) or dtype_reason(values[-1].dtype.torch, device)


def rows(v: ValueSpec) -> int | None:
    """The number of rows of a value seen as 2-D over its last dim (None when unknown)."""
    dims = v.shape[:-1] if v.shape else None
    return math.prod(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None


# FusedGemm / FusedConv / quantized layer activation (kinds/fused.py) -> kernels.common.activate name
FUSED_ACTS = {"none": "none", "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish",
              "SiLU": "silu", "Gelu": "gelu_erf", "GeluTanh": "gelu_tanh", "LeakyRelu": "leaky_relu", "Clip": "clip"}


def epilogue(attrs: dict) -> tuple[str, float, float]:
    """(activation, act_alpha, act_beta) of a fused layer: LeakyRelu's alpha, Clip's bounds (None: unbounded)."""
    name, params = attrs.get("activation", "none"), list(attrs.get("activation_params") or [])
    if name == "Clip":
        lo, hi = params
        return "clip", -float("inf") if lo is None else lo, float("inf") if hi is None else hi
    return FUSED_ACTS[name], params[0] if name == "LeakyRelu" else 1.0, 0.0


def act_kwargs(attrs: dict) -> dict:
    """`epilogue(attrs)` as the Triton launchers' activation, act_alpha and act_beta keywords."""
    act, alpha, beta = epilogue(attrs)
    return {"activation": act, "act_alpha": alpha, "act_beta": beta}


def conv_rows(out: tuple | None) -> int | None:
    """The GEMM rows N·OH·OW of a conv's NCHW output shape (None when unknown)."""
    return out[0] * out[2] * out[3] if out and all(isinstance(d, int) for d in (out[0], out[2], out[3])) else None


def mark_nhwc(configs) -> list[dict]:
    """Configs marked NHWC: the autotuner times them on the channels_last input their NHWC neighbours write."""
    return [{"layout": "nhwc", **c} for c in configs]


def conv_reason(spec: LayerSpec, device) -> str | None:
    """Why a Triton conv tactic cannot run this Conv / FusedConv whatever its channels and groups, or None: constant
    weights, 2-D, explicit pads, an activation the epilogue has, a 1-D bias, one float dtype."""
    a, w = spec.attrs, spec.inputs[1]
    if w is None or w.const is None:
        return "weights are not a build-time constant"
    if rank(spec.inputs[0]) != 4 or len(a.get("kernel_shape", ())) != 2:
        return "only 2-D convolutions"
    if a.get("auto_pad", "NOTSET") != "NOTSET":
        return "pads are not explicit (input shape unknown at build)"
    if a.get("activation", "none") not in FUSED_ACTS:
        return f"activation {a['activation']!r} has no Triton epilogue"
    if len(spec.inputs) > 2 and spec.inputs[2] is not None and rank(spec.inputs[2]) != 1:
        return "bias is not 1-D"
    return io_reason(spec, [v for v in (*spec.inputs, spec.outputs[0]) if v is not None], device)
