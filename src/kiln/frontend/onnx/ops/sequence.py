"""ONNX importers for the sequence and optional ops."""

from __future__ import annotations

from kiln.frontend.onnx.ops.controlflow import body_types
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, register_direct

register_direct("SequenceConstruct", "SequenceAt", "SequenceInsert", "SequenceErase", "SequenceLength",
                "SplitToSequence", "ConcatFromSequence", since=11)
register_direct("OptionalHasElement", "OptionalGetElement", since=15)


@register("SequenceEmpty", since=11)
def sequence_empty(node: OnnxNode, ctx: ImportContext) -> None:
    """The element type is the output's (typed from ONNX inference); the layer needs no attributes."""
    ctx.emit(node, "SequenceEmpty", [], node.outputs)


@register("Optional", since=15)
def optional(node: OnnxNode, ctx: ImportContext) -> None:
    """The `type` attribute (a TypeProto) only types an empty optional's output; it is not kept."""
    from kiln.frontend.onnx.importer import value_type

    if "type" in node.attrs:
        inner = value_type(node.attrs["type"].tp)
        if inner is not None:
            kind = {"tensor": "optional", "sequence": "optional_sequence"}.get(inner[2])
            ctx.type_missing(node.outputs, [(inner[0], inner[1], kind) if kind else None])
    ctx.emit(node, "Optional", [i for i in node.inputs if i], node.outputs)


@register("SequenceMap", since=17)
def sequence_map(node: OnnxNode, ctx: ImportContext) -> None:
    """The body sees one element of each sequence input per run; tensor inputs are passed whole."""
    elements = []
    for name in node.inputs:
        t = ctx.network.tensors[name]
        elements.append((t.dtype, t.shape, "tensor" if t.kind == "sequence" else t.kind))
    (body,), captures = ctx.bodies(node, [(node.attrs["body"].g, elements)])
    ctx.type_missing(node.outputs, [(d, s, "sequence") for d, s, _ in body_types(body, body.outputs)])
    ctx.emit(node, "SequenceMap", [*node.inputs, *captures], node.outputs, {"body": body, "captures": len(captures)})
