"""ONNX importers for the spectral ops: DFT, STFT, Hann/Hamming/Blackman windows, MelWeightMatrix."""

from __future__ import annotations

from kiln.errors import ModelError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, schema_defaults
from kiln.ir import DType


def _attrs(node: OnnxNode) -> dict:
    attrs = schema_defaults(node)
    attrs.update(node.attrs)
    return attrs


def _check_complex_dim(node: OnnxNode, ctx: ImportContext) -> None:
    """The signal's last dim holds (real) or (real, imaginary): 1 or 2."""
    shape = ctx.network.tensors[node.inputs[0]].shape
    if shape and isinstance(shape[-1], int) and shape[-1] not in (1, 2):
        raise ModelError(f"{node.where()}: the input's last dimension must be 1 (real) or 2 (complex), "
                         f"got {shape[-1]}")


@register("DFT", since=17)
def dft_17(node: OnnxNode, ctx: ImportContext) -> None:
    _check_complex_dim(node, ctx)
    ctx.emit(node, "DFT", node.inputs[:2], node.outputs, _attrs(node))


@register("DFT", since=20)
def dft_20(node: OnnxNode, ctx: ImportContext) -> None:
    """The axis became an input (default -2); the layer still carries the default as an attribute."""
    _check_complex_dim(node, ctx)
    ctx.emit(node, "DFT", node.inputs, node.outputs, _attrs(node) | {"axis": -2})


@register("STFT", since=17)
def stft(node: OnnxNode, ctx: ImportContext) -> None:
    _check_complex_dim(node, ctx)
    ctx.emit(node, "STFT", node.inputs, node.outputs, _attrs(node))


def _typed(node: OnnxNode, ctx: ImportContext) -> None:
    """Ops whose `output_datatype` attribute (an ONNX type code) picks the output type."""
    attrs = _attrs(node)
    attrs["output_datatype"] = DType.from_onnx(attrs["output_datatype"])
    ctx.emit(node, node.op_type, node.inputs, node.outputs, attrs)


for _op in ("HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"):
    register(_op, since=17)(_typed)
