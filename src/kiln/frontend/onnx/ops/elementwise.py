"""ONNX importers for elementwise arithmetic, math, comparison, logic and bitwise ops."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, dtype_of, register, register_direct
from kiln.ir import DType

_LEGACY_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater")


def _legacy_binary(node: OnnxNode, ctx: ImportContext) -> None:
    """Opset < 7: `broadcast=1` with `axis` aligns B at that axis; kiln imports the trailing alignment only."""
    if node.attr("broadcast", 0) and node.attr("axis") is not None:
        a, b = (ctx.network.tensors[i].shape for i in node.inputs)
        if a is None or b is None or node.attr("axis") % max(len(a), 1) != len(a) - len(b):
            raise UnsupportedOpError(f"{node.where()}: legacy broadcast with axis={node.attr('axis')} that does "
                                     "not align B with A's trailing dimensions; convert the model to opset >= 7")
    ctx.emit(node, node.op_type, node.inputs, node.outputs)


for _op in _LEGACY_BINARY:
    register(_op, since=1)(_legacy_binary)
register_direct(*_LEGACY_BINARY, since=7)
register_direct("LessOrEqual", "GreaterOrEqual", since=12)
register_direct("Mod", since=10)
register_direct("Neg", "Abs", "Ceil", "Floor", "Reciprocal", "Sqrt", "Exp", "Log", "Not", "Identity",
                "Max", "Min", "Sum", "Mean", "Clip", since=1)
register_direct("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", since=7)
register_direct("Sign", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf", "IsNaN", "Where", since=9)
register_direct("IsInf", since=10)
register_direct("Round", "BitShift", since=11)
register_direct("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", since=18)


@register("Dropout", since=1)
def dropout_legacy(node: OnnxNode, ctx: ImportContext) -> None:
    """Opset < 12: inference is the identity; the mask output is all ones (of type T before opset 10)."""
    if node.opset < 7 and not node.attr("is_test", 0):
        raise UnsupportedOpError(f"{node.where()}: is_test=0 asks for random training-mode dropout; kiln runs "
                                 "inference only: set is_test=1")
    outputs = list(node.outputs)
    mask_type = dtype_of(ctx, node.inputs[0]) if node.opset < 10 else DType.BOOL
    if len(outputs) > 1 and outputs[1] and mask_type is not DType.BOOL:
        outputs[1] = ctx.network.unique_name(outputs[1] + "_bool")
        ctx.network.add_tensor(outputs[1], DType.BOOL, ctx.network.tensors[node.inputs[0]].shape)
        ctx.emit(node, "Dropout", node.inputs[:1], outputs)
        ctx.emit(node, "Cast", [outputs[1]], [node.outputs[1]], {"to": mask_type})
        return
    ctx.emit(node, "Dropout", node.inputs[:1], outputs)


@register("Dropout", since=12)
def dropout(node: OnnxNode, ctx: ImportContext) -> None:
    """Opset >= 12: ratio and training_mode are inputs; random training-mode dropout is rejected when
    known at import (constant training_mode and ratio, no seed) and at run time otherwise."""
    inputs = node.inputs + [""] * (3 - len(node.inputs))
    training, ratio = ctx.constant(inputs[2]), ctx.constant(inputs[1])
    random = training is not None and bool(training) and (ratio is None or float(ratio) > 0)
    if random and inputs[1] and ratio is None:
        random = False  # the ratio may still be 0 at run time
    if random and node.attr("seed") is None:
        raise UnsupportedOpError(f"{node.where()}: training_mode=true with ratio > 0 and no seed is random "
                                 "dropout; kiln runs inference only: set training_mode to false")
    ctx.emit(node, "Dropout", inputs, node.outputs, {"ratio": 0.5, "seed": node.attr("seed")})
