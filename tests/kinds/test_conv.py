"""Conv family (Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv) against ONNX Runtime, randomized."""

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx import import_onnx
from opcheck import DEVICE, check_op, make_model, run_both

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((2, 4, 9), (6, 2, 3), {"group": 2, "strides": [2], "pads": [1, 2]}),
    ((1, 3, 8, 7), (4, 3, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 1], "dilations": [1, 2]}),
    ((1, 4, 7, 7), (4, 1, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 6, 7), (3, 2, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 2, 6, 6), (3, 2, 3, 3), {"auto_pad": "VALID"}),
    ((1, 2, 4, 5, 6), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 2]}),
])
@pytest.mark.parametrize("bias", [True, False])
def test_conv(x_shape, w_shape, attrs, bias):
    constants = {"w": randn(*w_shape)} | ({"b": randn(w_shape[0])} if bias else {})
    check_op("Conv", {"x": randn(*x_shape)}, attrs, constants=constants)


def test_conv_attributes_normalized_at_import():
    """Later passes key on these: explicit pads, filled strides/dilations/group, kernel from the weight."""
    model = make_model("Conv", {"x": randn(1, 2, 7, 7)}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
                       constants={"w": randn(3, 2, 3, 3), "b": randn(3)})
    layer = import_onnx(model).layers[0]
    assert layer.kind == "Conv" and layer.inputs == ["x", "w", "b"]
    assert layer.attrs == {"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [1, 1], "group": 1,
                           "pads": [1, 1, 1, 1], "auto_pad": "NOTSET"}


def test_conv_same_padding_with_dynamic_spatial_shape():
    """An unknown spatial shape keeps auto_pad; the reference resolves it per run."""
    model = make_model("Conv", {"x": randn(1, 2, 7, 6)}, {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
                       constants={"w": randn(3, 2, 3, 3)})
    for d, name in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("h", "w")):
        d.dim_param = name
    model = onnx.shape_inference.infer_shapes(model)
    assert import_onnx(model).layers[0].attrs["auto_pad"] == "SAME_LOWER"
    for shape in [(1, 2, 7, 6), (1, 2, 4, 9)]:
        want, got = run_both(model, {"x": randn(*shape)})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("x_shape, w_shape, attrs", [
    ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]}),
    ((1, 4, 3, 4), (4, 1, 2, 2), {"group": 2, "dilations": [2, 1], "strides": [1, 2]}),
    ((2, 2, 5), (2, 3, 3), {"strides": [3], "output_shape": [16]}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 1, 2, 3, 2), (1, 2, 2, 2, 2), {"strides": [2, 1, 2]}),
])
def test_conv_transpose(x_shape, w_shape, attrs):
    check_op("ConvTranspose", {"x": randn(*x_shape)}, attrs,
             constants={"w": randn(*w_shape), "b": randn(w_shape[1] * attrs.get("group", 1))})


def test_conv_integer():
    x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (4, 3, 3, 3)).astype(np.uint8)
    check_op("ConvInteger", {"x": x}, {"pads": [1, 1, 0, 0], "strides": [2, 1]},
             constants={"w": w, "xz": np.array(131, np.uint8), "wz": np.array(120, np.uint8)}, opset=10)


def test_qlinear_conv_per_channel():
    x = rng.integers(0, 256, (1, 3, 7, 7)).astype(np.uint8)
    w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    consts = {"xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8), "w": w,
              "ws": rng.uniform(0.005, 0.02, 4).astype(np.float32), "wz": np.zeros(4, np.int8),
              "ys": np.array(0.3, np.float32), "yz": np.array(100, np.uint8),
              "b": rng.integers(-500, 500, 4).astype(np.int32)}
    check_op("QLinearConv", {"x": x}, {"pads": [1, 1, 1, 1], "strides": [2, 2]}, constants=consts, opset=10,
             input_order=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"])


@pytest.mark.parametrize("offset_group, group, with_mask", [(1, 1, False), (2, 2, True)])
def test_deform_conv(offset_group, group, with_mask):
    x = randn(2, 4, 6, 5)
    w = randn(6, 4 // group, 3, 2)
    offset = randn(2, offset_group * 3 * 2 * 2, 3, 4)
    consts = {"w": w, "offset": offset, "b": randn(6)} | (
        {"mask": rng.uniform(0, 1, (2, offset_group * 6, 3, 4)).astype(np.float32)} if with_mask else {})
    check_op("DeformConv", {"x": x}, {"pads": [1, 0, 0, 1], "strides": [2, 1], "dilations": [1, 2],
                                      "group": group, "offset_group": offset_group},
             constants=consts, opset=19)


def test_conv_4d_is_rejected():
    model = make_model("Conv", {"x": randn(1, 1, 3, 3, 3, 3)}, constants={"w": randn(1, 1, 2, 2, 2, 2)})
    with pytest.raises(UnsupportedOpError, match="4-D Conv is not supported"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


def test_deform_conv_3d_is_rejected():
    model = make_model("DeformConv", {"x": randn(1, 1, 3, 3, 3)},
                       constants={"w": randn(1, 1, 2, 2, 2), "offset": randn(1, 24, 2, 2, 2)}, opset=19)
    with pytest.raises(UnsupportedOpError, match="3-D DeformConv"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))
