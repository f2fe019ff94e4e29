"""ONNX importers for QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear.

Every opset from 10 on only adds attributes (axis 13, saturate 19, block_size/output_dtype 21,
precision 23), whose schema defaults reproduce the older behaviour, so one importer serves all;
the output dtype is resolved here so the layer never needs ONNX's inference rules.
"""

from __future__ import annotations

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, dtype_of, register, register_direct, schema_defaults
from kiln.ir import DType


def _dtype_attr(node: OnnxNode, code: int) -> DType | None:
    """An ONNX TensorProto code attribute as a DType (0: unset)."""
    if not code:
        return None
    try:
        return DType.from_onnx(code)
    except ModelError as e:
        raise UnsupportedOpError(f"{node.where()}: {e}") from None


def _attrs(node: OnnxNode) -> dict:
    attrs = schema_defaults(node) | node.attrs
    attrs.setdefault("axis", 1)
    attrs.setdefault("block_size", 0)
    if attrs["block_size"] < 0:
        raise ModelError(f"{node.where()}: block_size must be positive, got {attrs['block_size']}")
    return attrs


@register("QuantizeLinear", since=10)
def quantize_linear(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = _attrs(node)
    has_zp = len(node.inputs) > 2 and node.inputs[2]
    out = dtype_of(ctx, node.inputs[2]) if has_zp else _dtype_attr(node, attrs.get("output_dtype", 0)) or DType.UINT8
    attrs.update(output_dtype=out, precision=_dtype_attr(node, attrs.get("precision", 0)),
                 saturate=bool(attrs.get("saturate", 1)))
    ctx.emit(node, "QuantizeLinear", node.inputs, node.outputs, attrs)


@register("DequantizeLinear", since=10)
def dequantize_linear(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = _attrs(node)
    scale = dtype_of(ctx, node.inputs[1])
    attrs["output_dtype"] = _dtype_attr(node, attrs.get("output_dtype", 0)) or scale
    ctx.emit(node, "DequantizeLinear", node.inputs, node.outputs, attrs)


register_direct("DynamicQuantizeLinear", since=11)
