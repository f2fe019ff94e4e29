"""ONNX importers for the matrix-multiplication ops."""

from __future__ import annotations

from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, register_direct, schema_defaults

register_direct("MatMul", since=1)
register_direct("MatMulInteger", "QLinearMatMul", since=10)


@register("Gemm", since=1)
def gemm(node: OnnxNode, ctx: ImportContext) -> None:
    """Gemm with its four ONNX attributes; opset < 7's `broadcast` flag is dropped (broadcasting is always on)."""
    attrs = schema_defaults(node) | node.attrs
    attrs = {"alpha": float(attrs["alpha"]), "beta": float(attrs["beta"]),
             "transA": int(attrs["transA"]), "transB": int(attrs["transB"])}
    ctx.emit(node, "Gemm", node.inputs, node.outputs, attrs)
