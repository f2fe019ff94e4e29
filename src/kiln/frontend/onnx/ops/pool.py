"""ONNX importers for the pooling ops, with the same normalized spatial attributes as the conv family."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.ops.conv import spatial_attrs
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, register_direct, schema_defaults


def _pool(node: OnnxNode, ctx: ImportContext, **extra) -> None:
    attrs = spatial_attrs(node, ctx, node.inputs[0]) | extra
    attrs.setdefault("ceil_mode", 0)
    ctx.emit(node, node.op_type, node.inputs, node.outputs, attrs)


register("MaxPool", since=1)(_pool)
register("AveragePool", since=1)(_pool)


@register("LpPool", since=1)
def lp_pool(node: OnnxNode, ctx: ImportContext) -> None:
    """LpPool; opset 1 had a float p, kiln keeps the integer exponent of later opsets."""
    p = node.attr("p", 2)
    if float(p) != int(p):
        raise UnsupportedOpError(f"{node.where()}: LpPool with non-integer p={p} is not supported")
    _pool(node, ctx, p=int(p))


@register("MaxUnpool", since=9)
def max_unpool(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = spatial_attrs(node, ctx, node.inputs[0])
    ctx.emit(node, "MaxUnpool", node.inputs, node.outputs,
             {k: attrs[k] for k in ("kernel_shape", "strides", "pads")})


register_direct("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", since=1)


@register("RoiAlign", since=10)
def roi_align(node: OnnxNode, ctx: ImportContext) -> None:
    """RoiAlign; opset 10 had no coordinate_transformation_mode and behaved as output_half_pixel."""
    attrs = schema_defaults(node) | node.attrs
    attrs.setdefault("coordinate_transformation_mode", "output_half_pixel")
    if attrs["mode"] not in ("avg", "max"):
        raise UnsupportedOpError(f"{node.where()}: RoiAlign mode {attrs['mode']!r} is not supported")
    ctx.emit(node, "RoiAlign", node.inputs, node.outputs, attrs)
