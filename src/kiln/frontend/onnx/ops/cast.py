"""ONNX importers for the cast op family: Cast, CastLike (a Cast to the type of its second input), BitCast."""

from __future__ import annotations

from onnx import TensorProto

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, dtype_of, register, schema_defaults
from kiln.ir import DType

_ROUND_MODES = ("up", "down", "nearest")


def _target(node: OnnxNode, code) -> DType:
    """The `to` type: an int code (opset >= 6) or a type name (Cast-1)."""
    try:
        return DType.from_onnx(TensorProto.DataType.Value(code) if isinstance(code, str) else code)
    except (ModelError, ValueError):
        raise UnsupportedOpError(f"{node.where()}: cast to element type {code} is not supported by kiln") from None


def _emit_cast(node: OnnxNode, ctx: ImportContext, to: DType) -> None:
    attrs = schema_defaults(node) | node.attrs
    round_mode = attrs.get("round_mode", "up")
    if round_mode not in _ROUND_MODES:
        raise UnsupportedOpError(f"{node.where()}: round_mode={round_mode!r} is not one of {_ROUND_MODES}")
    ctx.emit(node, "Cast", node.inputs[:1], node.outputs,
             {"to": to, "saturate": bool(attrs.get("saturate", 1)), "round_mode": round_mode})


@register("Cast", since=1)
def cast(node: OnnxNode, ctx: ImportContext) -> None:
    _emit_cast(node, ctx, _target(node, node.attr("to")))


@register("CastLike", since=15)
def cast_like(node: OnnxNode, ctx: ImportContext) -> None:
    _emit_cast(node, ctx, dtype_of(ctx, node.inputs[1]))


@register("BitCast", since=26)
def bit_cast(node: OnnxNode, ctx: ImportContext) -> None:
    src, to = dtype_of(ctx, node.inputs[0]), _target(node, node.attr("to"))
    if DType.STRING in (src, to) or src.bits != to.bits:
        raise UnsupportedOpError(f"{node.where()}: BitCast from {src} to {to} needs two non-string types "
                                 "of the same bit width")
    ctx.emit(node, "BitCast", node.inputs, node.outputs, {"to": to})
