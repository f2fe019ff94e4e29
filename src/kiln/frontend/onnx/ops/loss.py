"""ONNX importers for NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, schema_defaults

REDUCTIONS = ("none", "sum", "mean")


@register("NegativeLogLikelihoodLoss", since=12)
@register("SoftmaxCrossEntropyLoss", since=12)
def loss(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = {"ignore_index": None, **schema_defaults(node), **node.attrs}
    if attrs["reduction"] not in REDUCTIONS:
        raise UnsupportedOpError(f"{node.where()}: reduction={attrs['reduction']!r} is not supported; "
                                 f"use one of {REDUCTIONS}")
    ctx.emit(node, node.op_type, node.inputs, node.outputs, attrs)
