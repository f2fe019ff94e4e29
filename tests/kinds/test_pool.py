"""Pooling kinds against ONNX Runtime, randomized."""

import numpy as np
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from opcheck import DEVICE, check_op, make_model, run_both

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def with_output_type(model, shape):
    """Declare the float output's shape where ONNX shape inference gives none (it cannot read the data)."""
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", TensorProto.FLOAT, shape))
    return model


WINDOWS = [
    ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1}),
    ((1, 2, 8, 8), {"kernel_shape": [2, 3], "dilations": [2, 2], "strides": [1, 2]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 6, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 1, 4, 5, 6), {"kernel_shape": [2, 2, 3], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 1]}),
]


@pytest.mark.parametrize("shape, attrs", WINDOWS)
def test_max_pool_with_indices(shape, attrs):
    check_op("MaxPool", {"x": randn(*shape)}, attrs, n_outputs=2, opset=12)


def test_max_pool_column_major_indices():
    check_op("MaxPool", {"x": randn(2, 3, 5, 6)}, {"kernel_shape": [2, 2], "storage_order": 1},
             n_outputs=2, opset=12)


def test_max_pool_uint8():
    x = rng.integers(0, 256, (1, 2, 6, 6)).astype(np.uint8)
    check_op("MaxPool", {"x": x}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, opset=12)


@pytest.mark.parametrize("shape, attrs", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(shape, attrs, count_include_pad):
    check_op("AveragePool", {"x": randn(*shape)}, attrs | {"count_include_pad": count_include_pad}, opset=19)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    check_op("LpPool", {"x": randn(1, 2, 7, 6)},
             {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": p}, opset=18)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 4, 5), (1, 2, 3, 2, 4)])
def test_global_pool(op, shape):
    check_op(op, {"x": randn(*shape)})


@pytest.mark.parametrize("with_output_shape", [False, True])
def test_max_unpool(with_output_shape):
    """Indices pick one random element of every 2x2 window, as a MaxPool would.

    With output_shape, ORT reads the indices as positions in output_shape while ONNX's reference
    and backend test data read them in the default unpooled shape, then pad: kiln follows ONNX.
    """
    n, c, h, w = 1, 2, 3, 2
    x = randn(n, c, h, w)
    dy, dx = rng.integers(0, 2, (2, n, c, h, w))
    rows, cols = np.arange(h)[:, None] * 2 + dy, np.arange(w)[None, :] * 2 + dx
    planes = np.arange(n * c).reshape(n, c, 1, 1)
    index = (planes * (2 * h) * (2 * w) + rows * (2 * w) + cols).astype(np.int64)
    out_shape = [n, c, 2 * h + 1, 2 * w + 2] if with_output_shape else [n, c, 2 * h, 2 * w]
    consts = {"i": index} | ({"shape": np.array(out_shape, np.int64)} if with_output_shape else {})
    model = make_model("MaxUnpool", {"x": x}, {"kernel_shape": [2, 2], "strides": [2, 2]}, constants=consts, opset=11)
    (want,), (got,) = run_both(with_output_type(model, out_shape), {"x": x})
    if with_output_shape:
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert got.shape == want.shape == tuple(out_shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("attrs", [
    {"output_height": 3, "output_width": 2, "spatial_scale": 0.5},
    {"output_height": 2, "output_width": 2, "sampling_ratio": 2, "coordinate_transformation_mode": "output_half_pixel"},
    {"output_height": 2, "output_width": 3, "sampling_ratio": 1, "mode": "max"},  # ORT's max is right for ratio 1
])
def test_roi_align(attrs):
    x = randn(2, 3, 8, 9)
    rois = np.array([[0, 0, 7, 7], [1.5, 2.2, 6.1, 5.3], [-1, 3, 4, 12], [4, 4, 4.5, 4.2]], np.float32)
    check_op("RoiAlign", {"x": x, "rois": rois}, attrs, constants={"bi": np.array([0, 1, 1, 0], np.int64)},
             opset=16)


def test_lp_pool_fractional_p_is_rejected():
    model = make_model("LpPool", {"x": randn(1, 1, 4, 4)}, {"kernel_shape": [2, 2], "p": 1.5}, opset=1)
    with_output_type(model, [1, 1, 3, 3])
    with pytest.raises(UnsupportedOpError, match="non-integer p"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(p):
    x = np.random.default_rng(p).standard_normal((2, 3, 4, 5)).astype(np.float32)
    check_op("GlobalLpPool", {"x": x}, {"p": p})
