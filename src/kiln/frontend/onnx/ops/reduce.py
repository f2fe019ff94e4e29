"""ONNX importers for the reduce op family.

`axes` is an attribute before opset 13 (ReduceSum) / 18 (the others) and an optional input after;
both import as the same kind. A constant `axes` input becomes the `axes` attribute, a runtime one
stays an input.
"""

from __future__ import annotations

from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, register_direct, schema_defaults

REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")


def reduce(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0, **schema_defaults(node), **node.attrs}
    inputs = node.inputs[:1]
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = ctx.constant(node.inputs[1])
        if axes is None:
            inputs = node.inputs[:2]
        else:
            attrs["axes"] = [int(a) for a in axes.reshape(-1).tolist()]
    ctx.emit(node, node.op_type, inputs, node.outputs, attrs)


for _op in REDUCE_OPS:
    register(_op, since=1)(reduce)

register_direct("ArgMax", "ArgMin", since=1)
