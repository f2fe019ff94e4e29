"""Resampling kinds (Resize in every opset, Upsample, GridSample, AffineGrid, Col2Im) against ONNX Runtime."""

import numpy as np
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)
COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def f32(*values):
    return np.array(values, np.float32)


def i64(*values):
    return np.array(values, np.int64)


def resize(x, attrs, *, scales=None, sizes=None, roi=None, opset=19, **kw):
    """Check one Resize node; scales, sizes and roi are fed at run time."""
    inputs = {"x": x, "roi": roi if roi is not None else f32()}
    inputs |= {"scales": scales} if scales is not None else {}
    inputs |= {"sizes": sizes} if sizes is not None else {}
    order = ["x", "roi", "scales" if scales is not None else "", "sizes" if sizes is not None else ""]
    check_op("Resize", inputs, attrs, opset=opset, input_order=order, **kw)


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [(1, 1, 1.7, 0.6), (1, 1, 0.5, 2.5)])
def test_resize_scales(coord, mode, scales):
    if coord == "align_corners":  # ORT rounds the output length here, ONNX's reference does not: keep it whole
        scales = (1, 1, 1.6, 0.5)
    resize(rand(1, 2, 5, 4), {"mode": mode, "coordinate_transformation_mode": coord}, scales=f32(*scales))


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coord", COORDS)
def test_resize_nearest_sizes(nearest_mode, coord):
    x = rng.integers(-100, 100, (1, 2, 5, 7)).astype(np.int8)  # nearest copies values of any dtype
    resize(x, {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": coord},
           sizes=i64(1, 2, 8, 3))


@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_cubic_coefficient(exclude_outside):
    resize(rand(2, 1, 6, 6), {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": exclude_outside},
           scales=f32(1, 1, 0.7, 1.6))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode):
    # antialias filters stretch to ~10 taps: ORT's float32 sums differ from ours by a few ulps more
    resize(rand(1, 1, 12, 9), {"mode": mode, "antialias": 1}, sizes=i64(1, 1, 5, 4), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("policy,axes", [("stretch", [-1, -2]), ("not_larger", [2, 3]), ("not_smaller", [3, 2])])
def test_resize_axes_keep_aspect_ratio(policy, axes):
    resize(rand(1, 2, 6, 4), {"mode": "linear", "axes": axes, "keep_aspect_ratio_policy": policy},
           sizes=i64(9, 5))


def test_resize_tf_crop_and_resize():
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.0}
    resize(rand(1, 1, 5, 5), attrs, sizes=i64(1, 1, 4, 6), roi=f32(0, 0, -0.2, 0.3, 1, 1, 0.8, 1.3))


@pytest.mark.parametrize("opset", [11, 13])
def test_resize_older_opsets(opset):
    attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}
    resize(rand(1, 2, 4, 4), attrs, scales=f32(1, 1, 2, 0.5), opset=opset)
    resize(rand(1, 2, 4, 4), {"mode": "nearest"}, sizes=i64(1, 2, 7, 3), scales=f32() if opset == 11 else None,
           opset=opset)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 0.6, 0.4), (1, 1, 2.5, 1.7)])
def test_resize_v10(mode, scales):
    check_op("Resize", {"x": rand(2, 1, 7, 9), "scales": f32(*scales)}, {"mode": mode}, opset=10)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(mode):
    check_op("Upsample", {"x": rand(1, 2, 3, 4), "scales": f32(1, 1, 2.5, 2)}, {"mode": mode}, opset=9)
    check_op("Upsample", {"x": rand(1, 2, 3, 4)}, {"mode": mode, "scales": [1.0, 1.0, 2.0, 3.0]}, opset=7)


def test_resize_unsupported_mode():
    model = make_model("Resize", {"x": rand(1, 1, 2, 2), "scales": f32(1, 1, 2, 2)}, {"mode": "linear"},
                       input_order=["x", "", "scales"], opset=13)
    model.graph.node[0].attribute[0].s = b"area"
    with pytest.raises(UnsupportedOpError, match="mode='area'"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    grid = rng.uniform(-1.3, 1.3, (2, 3, 4, 2)).astype(np.float32)
    check_op("GridSample", {"x": rand(2, 3, 5, 4), "grid": grid},
             {"mode": mode, "padding_mode": padding, "align_corners": align}, opset=16)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_3d(mode):
    grid = rng.uniform(-1.2, 1.2, (1, 2, 3, 4, 3)).astype(np.float32)
    check_op("GridSample", {"x": rand(1, 2, 3, 4, 5), "grid": grid}, {"mode": mode, "padding_mode": "border"},
             opset=20)


def test_grid_sample_cubic_3d_is_unsupported():
    model = make_model("GridSample", {"x": rand(1, 1, 2, 2, 2), "grid": rand(1, 1, 1, 1, 3)}, {"mode": "cubic"},
                       opset=20)
    with pytest.raises(UnsupportedOpError, match="rank-5"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(align):
    check_op("AffineGrid", {"theta": rand(2, 2, 3), "size": i64(2, 3, 4, 5)}, {"align_corners": align}, opset=20)
    check_op("AffineGrid", {"theta": rand(1, 3, 4), "size": i64(1, 1, 2, 3, 4)}, {"align_corners": align},
             opset=20)


@pytest.mark.parametrize("attrs", [{}, {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}])
def test_col2im(attrs):
    image, block = (5, 6), (2, 3)
    strides, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0] * 4)
    blocks = [(image[i] + pads[i] + pads[i + 2] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(2)]
    cols = rand(2, 3 * 6, blocks[0] * blocks[1])
    check_op("Col2Im", {"cols": cols, "image": i64(*image), "block": i64(*block)}, attrs, opset=18)
