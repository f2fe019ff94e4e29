"""ONNX importers for the detection ops (NonMaxSuppression; RoiAlign lives with the conv family)."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register


@register("NonMaxSuppression", since=10)
def non_max_suppression(node: OnnxNode, ctx: ImportContext) -> None:
    if node.attr("center_point_box", 0) not in (0, 1):
        raise UnsupportedOpError(f"{node.where()}: center_point_box must be 0 or 1, "
                                 f"got {node.attr('center_point_box')}")
    direct("NonMaxSuppression", node, ctx)
