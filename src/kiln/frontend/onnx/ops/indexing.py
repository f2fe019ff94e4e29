"""ONNX importers for gather, scatter, selection and scan ops."""

from __future__ import annotations

from kiln.frontend.onnx.ops.shape import attr_inputs, register_checked
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register, register_direct

register_direct("Gather", since=1)
register_direct("GatherElements", "GatherND", "Unique", "CumSum", since=11)
register_direct("OneHot", "Compress", "NonZero", since=9)
register_direct("ReverseSequence", "TopK", since=10)
register_direct("CumProd", since=26)
register_checked("TensorScatter", 24, mode=("linear", "circular"))
for _op in ("ScatterElements", "ScatterND"):
    register_checked(_op, 11, reduction=("none", "add", "mul", "max", "min"))


@register("Scatter", since=9)
def scatter(node: OnnxNode, ctx: ImportContext) -> None:
    """The deprecated Scatter is ScatterElements without a reduction."""
    direct("Scatter", node, ctx, kind="ScatterElements")


@register("TopK", since=1)
def top_k_v1(node: OnnxNode, ctx: ImportContext) -> None:
    attr_inputs(node, ctx, "TopK", ["k"], keep=("axis",))
