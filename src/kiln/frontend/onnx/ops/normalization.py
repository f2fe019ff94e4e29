"""ONNX importers for the normalization op family."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, register_direct, schema_defaults

_STASH_TYPES = {1: "float", 10: "float16", 11: "double", 16: "bfloat16"}


def _attrs(node: OnnxNode) -> dict:
    """The node's attributes with the schema's defaults filled in; stash_type checked where present."""
    attrs = {**schema_defaults(node), **node.attrs}
    if attrs.get("stash_type", 1) not in _STASH_TYPES:
        raise UnsupportedOpError(f"{node.where()}: stash_type={attrs['stash_type']} is not a floating-point "
                                 f"type; use one of {_STASH_TYPES}")
    return attrs


@register("BatchNormalization", since=1)
def batch_normalization(node: OnnxNode, ctx: ImportContext) -> None:
    """Training-mode outputs only in the opset 14+ form (Y, running_mean, running_var); before opset 7,
    is_test=0 normalizes with the batch's own statistics."""
    a = _attrs(node)
    if not a.get("spatial", 1):
        raise UnsupportedOpError(f"{node.where()}: spatial=0 (per-activation statistics) is not supported; "
                                 "flatten the input to [N, C*D1*...] before the BatchNormalization")
    if node.opset < 14 and any(node.outputs[1:]):
        raise UnsupportedOpError(f"{node.where()}: training-mode outputs before opset 14 are not supported; "
                                 "convert the model to opset 14 or later")
    attrs = {"epsilon": a.get("epsilon", 1e-5), "momentum": a.get("momentum", 0.9),
             "training_mode": int(a.get("training_mode", 0) or a.get("is_test", 1) == 0)}
    ctx.emit(node, "BatchNormalization", node.inputs, node.outputs, attrs)


@register("LayerNormalization", since=17)
@register("RMSNormalization", since=23)
@register("GroupNormalization", since=21)
def stashed_normalization(node: OnnxNode, ctx: ImportContext) -> None:
    ctx.emit(node, node.op_type, node.inputs, node.outputs, _attrs(node))


@register("GroupNormalization", since=18)
def group_normalization_18(node: OnnxNode, ctx: ImportContext) -> None:
    """Opset 18: scale and bias have one value per group."""
    ctx.emit(node, node.op_type, node.inputs, node.outputs, {**_attrs(node), "group_affine": True})


@register("InstanceNormalization", since=1)
def instance_normalization(node: OnnxNode, ctx: ImportContext) -> None:
    epsilon = node.attr("epsilon", 1e-5)
    ctx.emit(node, "InstanceNormalization", node.inputs, node.outputs, {"epsilon": epsilon})


@register("LpNormalization", since=1)
def lp_normalization(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = _attrs(node)
    if attrs["p"] not in (1, 2):
        raise UnsupportedOpError(f"{node.where()}: p={attrs['p']} is not supported; ONNX defines p=1 and p=2")
    ctx.emit(node, node.op_type, node.inputs, node.outputs, attrs)


register_direct("LRN", since=1)
register_direct("MeanVarianceNormalization", since=9)
