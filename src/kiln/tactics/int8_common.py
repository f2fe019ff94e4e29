"""What the quantized Triton and Gluon tactics (tactics/triton_int8*.py) share beyond the GEMM lowering
(tactics/int8_lowering.py): the GEMM's rows, the NHWC config mark, the device and layer checks of the TMA and
Gluon kernels, the epilogue keywords of both launcher families, and the int8/fp8 variant table that makes one
launcher a tactic per quantized type (`qtype_variants`, listed in the layer kinds' tables: tactics/quant_*.py)."""

from __future__ import annotations

from typing import Callable

from kiln.kernels import int8_conv_tma, int8_gemm_wgmma
from kiln.kernels.common import TensorDescriptor, capability
from kiln.kinds.qtype import FP8, INT8, QType
from kiln.kinds.quantized import float_out
from kiln.tactics import int8_lowering
from kiln.tactics.registry import Tactic
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import act_kwargs, epilogue, mark_nhwc, rows

TMA_MIN_CC = (9, 0)


def gemm_rows(spec: LayerSpec) -> int | None:
    """M of a QuantGemm / QuantConv lowered to one GEMM: the input's rows, or N·OH·OW (None when unknown)."""
    x = spec.inputs[0]
    if spec.kind == "QuantGemm":
        return rows(x)
    out = spec.outputs[0].shape
    return out[0] * out[2] * out[3] if out and all(isinstance(d, int) for d in out) else None


def nhwc(spec: LayerSpec, configs: list[dict]) -> list[dict]:
    """A conv's GEMM configs marked NHWC: its rows are a view of channels_last input (no im2col copy for a
    1x1), so the autotuner times it on the input its NHWC neighbours write."""
    return mark_nhwc(configs) if spec.kind == "QuantConv" else configs


def out_hw(spec: LayerSpec) -> tuple[int | None, int | None]:
    """A conv's output height and width (None where not static)."""
    out = spec.outputs[0].shape
    oh, ow = (d if isinstance(d, int) else None for d in (out or (None,) * 4)[2:])
    return oh, ow


def tma_device_reason(device) -> str | None:
    """Why `device` (or this triton) cannot run the TMA and Gluon kernels, or None."""
    if TensorDescriptor is None:
        return "this triton has no tensor descriptors"
    cc = capability(device)
    if cc is not None and cc < TMA_MIN_CC:
        return f"TMA needs compute capability 9.0, the device has {cc[0]}.{cc[1]}"
    return None


def tma_conv_reason(spec: LayerSpec) -> str | None:
    """Why the TMA implicit-GEMM convs (4-D input boxes) cannot take this layer, or None."""
    a, w = spec.attrs, spec.inputs[1].const
    if spec.kind != "QuantConv" or w is None or w.dim() != 4:
        return "2-D convolutions only"
    if (tuple(a.get("strides", (1, 1))) != (1, 1) and not int8_lowering.subsample(spec)) or a.get("group", 1) != 1:
        return "group 1, stride 1 (or a strided 1x1 unpadded conv: a subsample) only"
    if not int8_conv_tma.addressable(w.shape[1], w.shape[2] * w.shape[3]):
        return "input channels not a multiple of 16 (TMA's 16-byte strides)"
    return None


def gluon_epilogue_reason(spec: LayerSpec) -> str | None:
    """Why the Gluon kernels' epilogue (ReLU, erf GELU or none; int8 out; an int8 residual) cannot run it, or None."""
    a = spec.attrs
    if not int8_gemm_wgmma.available():
        return "this triton has no Gluon"
    if epilogue(a)[0] not in int8_gemm_wgmma.ACTIVATIONS:
        return f"activations {', '.join(int8_gemm_wgmma.ACTIVATIONS)} only"
    if a.get("out_scale") is None:
        return "requantized int8 outputs only"
    if int8_lowering.has_residual(spec) and a.get("res_scale") is None:
        return "int8 residuals only"
    return None


def triton_epilogue_kwargs(attrs: dict) -> dict:
    """The Triton quantized launchers' epilogue keywords: scales, activation and the float output's dtype."""
    return dict(out_scale=attrs["out_scale"], res_scale=attrs.get("res_scale"), **act_kwargs(attrs),
                out_dtype=float_out(attrs))


def gluon_epilogue_kwargs(attrs: dict) -> dict:
    """The Gluon launchers' epilogue keywords (int8 out, no activation parameters)."""
    return dict(out_scale=attrs["out_scale"], res_scale=attrs.get("res_scale"), activation=epilogue(attrs)[0])


def qtype_reason(spec: LayerSpec, device, qt: QType) -> str | None:
    """Why the GEMM lowering cannot run `spec` as a `qt` layer on `device` (fp8 needs compute capability 8.9)."""
    return int8_lowering.supports(spec, qt) or (int8_lowering.fp8_device_reason(device) if qt is FP8 else None)


QTYPES = ((INT8, False), (FP8, True))  # the variants of one launcher: quantized type, architecture-specific


def qtype_variants(stem: str, kinds: tuple[str, ...], compile, configs, priority: int, *,
                   layer_reason: Callable[[LayerSpec], str | None] | None = None,
                   device_reason: Callable[[object], str | None] | None = None,
                   arch_specific: bool = False) -> tuple[Tactic, ...]:
    """triton_int8_<stem> then triton_fp8_<stem> (QTYPES' order), one launcher for both types, for a layer kind's
    table (tactics/quant_*.py registers them). Each variant's `supports` is the layer check, then the lowering's check
    for its type (`qtype_reason`), then the device check; fp8 variants are architecture-specific."""
    return tuple(Tactic(f"triton_{qt.label}_{stem}", kinds, compile, _variant_supports(qt, layer_reason, device_reason),
                        configs, priority=priority, arch_specific=arch_specific or fp8_arch, writes_out=True)
                 for qt, fp8_arch in QTYPES)


def _variant_supports(qt: QType, layer_reason, device_reason):
    def supports(spec: LayerSpec, device) -> str | None:
        return (layer_reason(spec) if layer_reason else None) or qtype_reason(spec, device, qt) or \
            (device_reason(device) if device_reason else None)

    return supports
