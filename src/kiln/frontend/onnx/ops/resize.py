"""ONNX importers for resampling ops: Resize (all opsets), Upsample, GridSample, AffineGrid, Col2Im.

Every Resize layer carries the full opset-19 attribute set, so older opsets and Upsample become
Resize layers with the attribute values that reproduce their semantics.
"""

from __future__ import annotations

import torch

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.ops.shape import attrs_of, const_input
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, register_direct

register_direct("AffineGrid", since=20)
register_direct("Col2Im", since=18)

_RESIZE_DEFAULTS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                    "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75, "exclude_outside": 0,
                    "extrapolation_value": 0.0, "antialias": 0, "axes": [], "keep_aspect_ratio_policy": "stretch"}
_CHOICES = {"mode": ("nearest", "linear", "cubic"),
            "coordinate_transformation_mode": ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                                               "align_corners", "asymmetric", "tf_crop_and_resize",
                                               "tf_half_pixel_for_nn"),
            "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"),
            "keep_aspect_ratio_policy": ("stretch", "not_larger", "not_smaller")}


def _emit_resize(node: OnnxNode, ctx: ImportContext, inputs: list[str], attrs: dict) -> None:
    """Check the attribute values, then emit one Resize layer with all attributes set."""
    full = dict(_RESIZE_DEFAULTS, **{k: v for k, v in attrs.items() if k in _RESIZE_DEFAULTS})
    full["mode"] = {"bilinear": "linear", "trilinear": "linear"}.get(full["mode"], full["mode"])
    for name, allowed in _CHOICES.items():
        if full[name] not in allowed:
            raise UnsupportedOpError(f"{node.where()}: {name}={full[name]!r} is not supported "
                                     f"(supported: {', '.join(allowed)})")
    if full["antialias"] and full["mode"] == "nearest":
        raise UnsupportedOpError(f"{node.where()}: antialias is defined for linear and cubic modes only")
    ctx.emit(node, "Resize", inputs + [""] * (4 - len(inputs)), node.outputs, full)


@register("Resize", since=11)
def resize(node: OnnxNode, ctx: ImportContext) -> None:
    _emit_resize(node, ctx, node.inputs, attrs_of(node))


def _asymmetric(node: OnnxNode, ctx: ImportContext, scales: str) -> None:
    """Resize-10 and Upsample: output = floor(input × scale), x_original = x_resized / scale, and
    nearest rounds down when upsampling and up when downsampling (ONNX Runtime's reading)."""
    attrs = dict(attrs_of(node), coordinate_transformation_mode="asymmetric", nearest_mode="simple")
    _emit_resize(node, ctx, [node.inputs[0], "", scales], attrs)


@register("Resize", since=10)
@register("Upsample", since=9)
def resize_v10(node: OnnxNode, ctx: ImportContext) -> None:
    _asymmetric(node, ctx, node.inputs[1])


@register("Upsample", since=7)
def upsample_v7(node: OnnxNode, ctx: ImportContext) -> None:
    _asymmetric(node, ctx, const_input(ctx, node, "scales", node.attr("scales"), torch.float32))


_GRID_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "nearest": "nearest", "cubic": "cubic"}


@register("GridSample", since=16)
def grid_sample(node: OnnxNode, ctx: ImportContext) -> None:
    """GridSample on 2-D and 3-D images (rank 4 and 5); cubic on 2-D only."""
    attrs = attrs_of(node)
    mode = _GRID_MODES.get(attrs["mode"])
    shape = ctx.network.tensors[node.inputs[0]].shape
    rank = len(shape) if shape is not None else None
    if mode is None or attrs["padding_mode"] not in ("zeros", "border", "reflection"):
        raise UnsupportedOpError(f"{node.where()}: mode {attrs['mode']!r} with padding_mode "
                                 f"{attrs['padding_mode']!r} is not supported")
    if rank not in (4, 5) or (rank == 5 and mode == "cubic"):
        raise UnsupportedOpError(f"{node.where()}: GridSample {mode} on a rank-{rank} input is not supported "
                                 "(kiln samples 2-D images, and 3-D volumes with linear or nearest)")
    ctx.emit(node, "GridSample", node.inputs, node.outputs,
             {"mode": mode, "padding_mode": attrs["padding_mode"], "align_corners": attrs["align_corners"]})
