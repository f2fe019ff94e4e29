"""ONNX importers for the shape op family.

Older opsets carry shapes, axes and pads as attributes; they become constant inputs here so that
each layer kind has one signature across opsets.
"""

from __future__ import annotations

import torch

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import (ImportContext, OnnxNode, dtype_of, register, register_direct,
                                         schema_defaults)
from kiln.ir import DType


def attrs_of(node: OnnxNode) -> dict:
    """The node's attributes with its schema's defaults filled in."""
    attrs = schema_defaults(node)
    attrs.update(node.attrs)
    return attrs


def const_input(ctx: ImportContext, node: OnnxNode, what: str, value, dtype=torch.int64) -> str:
    """A constant input made from an attribute value (or "" when the attribute is absent)."""
    if value is None:
        return ""
    return ctx.add_constant(f"{node.outputs[0]}_{what}", torch.tensor(value, dtype=dtype))


def attr_inputs(node: OnnxNode, ctx: ImportContext, kind: str, names: list[str], keep: tuple[str, ...] = ()) -> None:
    """Emit `kind` with the attributes `names` moved to constant inputs after the node's first input."""
    attrs = attrs_of(node)
    moved = [const_input(ctx, node, n, attrs.pop(n, None)) for n in names]
    ctx.emit(node, kind, node.inputs[:1] + moved, node.outputs, {k: attrs[k] for k in keep if k in attrs})


def checked(node: OnnxNode, ctx: ImportContext, choices: dict[str, tuple]) -> None:
    """Import one-to-one after checking that each named attribute has a value kiln implements."""
    attrs = attrs_of(node)
    for name, allowed in choices.items():
        if attrs.get(name, allowed[0]) not in allowed:
            raise UnsupportedOpError(f"{node.where()}: {name}={attrs[name]!r} is not supported "
                                     f"(supported: {', '.join(map(str, allowed))})")
    ctx.emit(node, node.op_type, node.inputs, node.outputs, attrs)


def register_checked(op: str, since: int, **choices: tuple) -> None:
    """Register a one-to-one importer for `op` that rejects attribute values outside `choices`."""
    register(op, since)(lambda node, ctx: checked(node, ctx, choices))


register_direct("Reshape", since=5)
register_direct("Transpose", "Concat", "Flatten", "Shape", "Size", since=1)
register_checked("DepthToSpace", 1, mode=("DCR", "CRD"))
register_checked("SpaceToDepth", 1, mode=("DCR", "CRD"))
register_direct("Expand", since=8)
register_direct("Tile", since=6)
register_direct("Slice", since=10)
register_direct("Squeeze", "Unsqueeze", since=13)
register_direct("Range", since=11)
register_direct("Trilu", since=14)
register_direct("CenterCropPad", since=18)


@register("Reshape", since=1)
def reshape_v1(node: OnnxNode, ctx: ImportContext) -> None:
    attr_inputs(node, ctx, "Reshape", ["shape"])


@register("Slice", since=1)
def slice_v1(node: OnnxNode, ctx: ImportContext) -> None:
    attr_inputs(node, ctx, "Slice", ["starts", "ends", "axes"])


@register("Squeeze", since=1)
def squeeze_v1(node: OnnxNode, ctx: ImportContext) -> None:
    attr_inputs(node, ctx, "Squeeze", ["axes"])


@register("Unsqueeze", since=1)
def unsqueeze_v1(node: OnnxNode, ctx: ImportContext) -> None:
    attr_inputs(node, ctx, "Unsqueeze", ["axes"])


def _split(node: OnnxNode, ctx: ImportContext) -> None:
    """Split at any opset: sizes from the `split` attribute or input, else `num_outputs` parts."""
    attrs = attrs_of(node)
    sizes = node.inputs[1] if len(node.inputs) > 1 else const_input(ctx, node, "split", attrs.get("split") or None)
    ctx.emit(node, "Split", [node.inputs[0], sizes], node.outputs,
             {"axis": attrs.get("axis", 0), "num_outputs": attrs.get("num_outputs") or len(node.outputs)})


for _v in (1, 2, 11, 13, 18):
    register("Split", since=_v)(_split)

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_mode(node: OnnxNode, attrs: dict) -> str:
    mode = attrs.get("mode", "constant")
    if mode not in _PAD_MODES or (mode == "wrap" and node.opset < 19):
        raise UnsupportedOpError(f"{node.where()}: Pad mode {mode!r} is not supported (use one of {_PAD_MODES})")
    return mode


@register("Pad", since=1)
def pad_v1(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = attrs_of(node)
    pads = attrs.get("pads", attrs.get("paddings"))
    value = const_input(ctx, node, "value", attrs.get("value", 0.0), torch.float32)
    ctx.emit(node, "Pad", [node.inputs[0], const_input(ctx, node, "pads", pads), value], node.outputs,
             {"mode": _pad_mode(node, attrs)})


@register("Pad", since=11)
def pad_v11(node: OnnxNode, ctx: ImportContext) -> None:
    ctx.emit(node, "Pad", node.inputs, node.outputs, {"mode": _pad_mode(node, attrs_of(node))})


@register("ConstantOfShape", since=9)
def constant_of_shape(node: OnnxNode, ctx: ImportContext) -> None:
    value = node.attr("value")
    ctx.emit(node, "ConstantOfShape", node.inputs, node.outputs,
             {"value": value if value is not None else torch.zeros(1, dtype=torch.float32)})


@register("EyeLike", since=9)
def eye_like(node: OnnxNode, ctx: ImportContext) -> None:
    code = node.attr("dtype")
    dtype = DType.from_onnx(code) if code is not None else dtype_of(ctx, node.inputs[0])
    ctx.emit(node, "EyeLike", node.inputs, node.outputs, {"dtype": dtype, "k": node.attr("k", 0)})

