"""ONNX importers for the conv op family: attributes are normalized so later passes never re-derive them.

Every layer gets kernel_shape, strides, dilations, pads (explicit, [begins..., ends...]) and group;
auto_pad is resolved into pads whenever the input's spatial shape is static.
"""

from __future__ import annotations

from kiln.errors import ShapeError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, schema_defaults
from kiln.kinds.conv import resolve_pads, transpose_pads


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def spatial_attrs(node: OnnxNode, ctx: ImportContext, x: str, w: str | None = None, max_dims: int = 3) -> dict:
    """Schema defaults + node attributes with kernel_shape (from the weight if absent), strides,
    dilations and pads filled, and auto_pad resolved to explicit pads when x's shape is static."""
    attrs = schema_defaults(node)
    attrs.update(node.attrs)
    w_shape = ctx.network.tensors[w].shape if w else None
    if not attrs.get("kernel_shape"):
        if not _static(w_shape):
            raise UnsupportedOpError(f"{node.where()}: kernel_shape is not given and the weight's shape is unknown")
        attrs["kernel_shape"] = list(w_shape[2:])
    n = len(attrs["kernel_shape"])
    if not 1 <= n <= max_dims:
        raise UnsupportedOpError(f"{node.where()}: {n}-D {node.op_type} is not supported (1-D to {max_dims}-D are)")
    attrs["strides"] = list(attrs.get("strides") or [1] * n)
    attrs["dilations"] = list(attrs.get("dilations") or [1] * n)
    attrs["pads"] = list(attrs.get("pads") or [0] * (2 * n))
    attrs.setdefault("auto_pad", "NOTSET")
    if node.op_type == "ConvTranspose":
        attrs["output_padding"] = list(attrs.get("output_padding") or [0] * n)
        attrs["output_shape"] = list(attrs["output_shape"]) if attrs.get("output_shape") else None
    _resolve_auto_pad(attrs, ctx.network.tensors[x].shape, n)
    return attrs


def _resolve_auto_pad(attrs: dict, x_shape, n: int) -> None:
    """Turn auto_pad (and ConvTranspose's output_shape) into explicit pads where the shapes allow."""
    transposed = "output_padding" in attrs
    if attrs["auto_pad"] == "NOTSET" and not (transposed and attrs["output_shape"]):
        return
    if not _static(x_shape) and (attrs["auto_pad"] != "VALID" or transposed and attrs["output_shape"]):
        return
    resolve = transpose_pads if transposed else resolve_pads
    attrs["pads"] = resolve(x_shape[2:] if _static(x_shape) else [0] * n, attrs)
    attrs["auto_pad"] = "NOTSET"
    if transposed:
        attrs["output_shape"] = None


def _emit(node: OnnxNode, ctx: ImportContext, attrs: dict) -> None:
    ctx.emit(node, node.op_type, node.inputs, node.outputs, attrs)


def _check_channels(node: OnnxNode, ctx: ImportContext, attrs: dict, has_bias: bool = True) -> None:
    """Input channels must equal the weight's channels × group, and a bias hold one value per output channel,
    where the shapes are known: a ShapeError at build, not a failing kernel at run time."""
    x, w = (ctx.network.tensors[n].shape for n in node.inputs[:2])
    if x is None or w is None or len(x) < 2 or len(w) < 2:
        return
    c, wc, group = x[1], w[1], attrs.get("group", 1)
    if isinstance(c, int) and isinstance(wc, int) and c != wc * group:
        raise ShapeError(f"{node.where()}: the input has {c} channels but the weight takes {wc} × group {group} "
                         f"= {wc * group}; fix the model's input shape or weights")
    b = ctx.network.tensors[node.inputs[2]].shape if has_bias and len(node.inputs) > 2 and node.inputs[2] else None
    if b is not None and isinstance(w[0], int) and (len(b) != 1 or isinstance(b[0], int) and b[0] != w[0]):
        raise ShapeError(f"{node.where()}: the bias has shape {list(b)} but the weight has {w[0]} output channels; "
                         f"the bias must be 1-D with {w[0]} elements")


@register("Conv", since=1)
def conv(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = spatial_attrs(node, ctx, node.inputs[0], node.inputs[1])
    _check_channels(node, ctx, attrs)
    _emit(node, ctx, attrs)


@register("ConvInteger", since=10)
def conv_integer(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = spatial_attrs(node, ctx, node.inputs[0], node.inputs[1])
    _check_channels(node, ctx, attrs, has_bias=False)  # its third input is x's zero point
    _emit(node, ctx, attrs)


@register("QLinearConv", since=10)
def qlinear_conv(node: OnnxNode, ctx: ImportContext) -> None:
    _emit(node, ctx, spatial_attrs(node, ctx, node.inputs[0], node.inputs[3]))


@register("DeformConv", since=19)
def deform_conv(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = spatial_attrs(node, ctx, node.inputs[0], node.inputs[1], max_dims=2)
    if len(attrs["kernel_shape"]) != 2:
        raise UnsupportedOpError(f"{node.where()}: only 2-D DeformConv is supported")
    _emit(node, ctx, attrs)


@register("ConvTranspose", since=1)
def conv_transpose(node: OnnxNode, ctx: ImportContext) -> None:
    """ConvTranspose; output_shape and SAME auto_pad become explicit pads when x's shape is static."""
    _emit(node, ctx, spatial_attrs(node, ctx, node.inputs[0], node.inputs[1]))
