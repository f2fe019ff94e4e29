"""Reduce kinds and ArgMax/ArgMin against ONNX Runtime: axes as attribute, constant and runtime
input, keepdims, noop_with_empty_axes, empty reductions, and integer/bool result dtypes."""

import numpy as np
import pytest

from opcheck import check_op, make_model, run_both

rng = np.random.default_rng(0)

REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _positive(shape):
    return rng.uniform(0.5, 1.5, shape).astype(np.float32)  # keeps ReduceLogSum and ReduceProd well-conditioned


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, -1], 0), (None, 1)])
def test_reduce_axes_attribute(op, axes, keepdims):
    attrs = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    check_op(op, {"x": _positive((3, 4, 5))}, attrs, opset=11)


@pytest.mark.parametrize("op", REDUCE)
def test_reduce_constant_axes_input(op):
    check_op(op, {"x": _positive((2, 3, 4))}, {"keepdims": 0}, constants={"axes": np.array([0, 2], np.int64)},
             opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceLogSumExp"])
def test_reduce_runtime_axes_input(op):
    feeds = {"x": _positive((2, 3, 4)), "axes": np.array([-1, 0], np.int64)}
    model = make_model(op, feeds, {"keepdims": 0}, opset=18)
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 3  # inference cannot know it
    want, got = run_both(model, feeds)
    assert got[0].shape == (3,) and got[0].dtype == np.float32
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceSumSquare", "ReduceL2"])
def test_noop_with_empty_axes_still_maps_elements(op):
    check_op(op, {"x": rng.standard_normal((2, 3)).astype(np.float32)}, {"noop_with_empty_axes": 1},
             constants={"axes": np.zeros(0, np.int64)}, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceLogSumExp"])
def test_reduce_over_empty_set_gives_identity(op):
    check_op(op, {"x": np.zeros((2, 0, 4), np.float32)}, {"keepdims": 1},
             constants={"axes": np.array([1], np.int64)}, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_int_keeps_dtype(op, dtype):
    x = rng.integers(-5, 6, (3, 4)).astype(dtype)
    check_op(op, {"x": x}, {"keepdims": 0}, constants={"axes": np.array([1], np.int64)}, opset=18)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_reduce_max_small_ints(dtype):
    x = rng.integers(0, 100, (3, 4)).astype(dtype)
    check_op("ReduceMax", {"x": x}, {"keepdims": 0}, constants={"axes": np.array([0], np.int64)}, opset=18)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(op):
    x = rng.integers(0, 2, (3, 4)).astype(bool)
    check_op(op, {"x": x}, {"keepdims": 1}, constants={"axes": np.array([1], np.int64)}, opset=20)


def test_reduce_mean_fp16_accumulates_wide():
    x = rng.uniform(0, 1, (4, 512)).astype(np.float16)
    check_op("ReduceMean", {"x": x}, {"keepdims": 0}, constants={"axes": np.array([1], np.int64)},
             opset=18, rtol=1e-3, atol=1e-3)  # fp16 output: one half-precision ulp


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (-1, 0, 0), (1, 1, 1), (1, 0, 1)])
def test_arg(op, axis, keepdims, last):
    x = rng.integers(0, 3, (3, 4, 2)).astype(np.float32)  # many ties, so first vs last index matters
    check_op(op, {"x": x}, {"axis": axis, "keepdims": keepdims, "select_last_index": last}, opset=13)


def test_argmax_int32():
    check_op("ArgMax", {"x": rng.integers(-9, 9, (4, 5)).astype(np.int32)}, {"axis": 1}, opset=13)
