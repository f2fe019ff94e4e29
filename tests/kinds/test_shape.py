"""Shape kinds against ONNX Runtime, randomized; shape-like inputs are fed at run time where ONNX allows."""

import numpy as np
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def i64(*values):
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize("shape,allowzero", [((0, -1), 0), ((3, 0, 2), 0), ((-1,), 0), ((2, 0), 1)])
def test_reshape_runtime_shape(shape, allowzero):
    x = rand(3, 4, 2) if allowzero == 0 else rand(2, 0)
    check_op("Reshape", {"x": x, "shape": i64(*shape)}, {"allowzero": allowzero}, opset=14)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    check_op("Transpose", {"x": rand(2, 3, 4)}, {"perm": perm} if perm else {})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for i, s in enumerate(shapes):
        s[axis] = i  # includes an empty input
    check_op("Concat", {f"x{i}": rand(*s) for i, s in enumerate(shapes)}, {"axis": axis})


def test_split_sizes_input():
    check_op("Split", {"x": rand(7, 3)}, {"axis": 0}, constants={"split": i64(2, 0, 5)}, n_outputs=3, opset=13)


def test_split_num_outputs_uneven():
    check_op("Split", {"x": rand(2, 7)}, {"axis": 1, "num_outputs": 3}, n_outputs=3, opset=18)


def test_split_v11_attribute_and_equal_parts():
    check_op("Split", {"x": rand(6, 2)}, {"axis": -2, "split": [1, 5]}, n_outputs=2, opset=11)
    check_op("Split", {"x": rand(6, 2)}, {}, n_outputs=3, opset=11)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, 0], [3, -1], [0, 2], [1, 2]),
    ([-1, 10], [-100, -100], [1, 2], [-1, -3]),       # negative steps, out-of-range starts and ends
    ([100], [200], [0], [1]),                         # empty result
    ([0, 1], [2**62, 3], [-3, -2], [1, 1]),
])
def test_slice_runtime(starts, ends, axes, steps):
    check_op("Slice", {"x": rand(4, 5, 6), "starts": i64(*starts), "ends": i64(*ends), "axes": i64(*axes),
                       "steps": i64(*steps)})


def test_slice_int32_without_axes_and_steps():
    x = rand(4, 5)
    check_op("Slice", {"x": x}, constants={"s": np.array([1, -4], np.int32), "e": np.array([3, 4], np.int32)},
             input_order=["x", "s", "e"])


def test_slice_v1_attributes():
    check_op("Slice", {"x": rand(4, 5)}, {"starts": [1], "ends": [-1], "axes": [1]}, opset=9)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze(opset):
    x = rand(1, 3, 1, 2)
    if opset == 13:
        check_op("Squeeze", {"x": x}, constants={"axes": i64(0, -2)}, opset=13)
        check_op("Unsqueeze", {"x": rand(3, 2)}, constants={"axes": i64(3, 0, -1)}, opset=13)
    else:
        check_op("Squeeze", {"x": x}, {"axes": [-4]}, opset=11)
        check_op("Unsqueeze", {"x": rand(3, 2)}, {"axes": [1, -1]}, opset=11)
    check_op("Squeeze", {"x": x}, opset=opset)


@pytest.mark.parametrize("axis", [0, 2, -1, 4])
def test_flatten(axis):
    check_op("Flatten", {"x": rand(2, 3, 1, 4)}, {"axis": axis})


@pytest.mark.parametrize("shape", [(3, 1, 4), (2, 1, 1, 1), (4,), (1,)])
def test_expand(shape):
    check_op("Expand", {"x": rand(3, 1, 1), "shape": i64(*shape)})


def test_tile():
    check_op("Tile", {"x": rand(2, 3), "repeats": i64(3, 2)})
    check_op("Tile", {"x": np.arange(4, dtype=np.int32).reshape(2, 2), "repeats": i64(1, 0)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(1, 2, 2, 0), (0, -1, 2, 1)])
def test_pad_modes(mode, pads):
    x = rand(3, 4)
    check_op("Pad", {"x": x, "pads": i64(*pads), "value": np.array(1.5, np.float32)}, {"mode": mode}, opset=19)


def test_pad_axes_and_int():
    x = rng.integers(-9, 9, (2, 3, 4)).astype(np.int32)
    check_op("Pad", {"x": x, "pads": i64(1, 0, 2, 3)}, constants={"v": np.array(7, np.int32), "axes": i64(-1, 0)},
             input_order=["x", "pads", "v", "axes"], opset=18)


def test_pad_v2_attributes():
    check_op("Pad", {"x": rand(2, 3)}, {"pads": [0, 1, 1, 2], "mode": "edge"}, opset=2)
    check_op("Pad", {"x": rand(2, 3)}, {"pads": [1, 1, 0, 0], "value": 2.0}, opset=2)


def test_pad_wrap_before_opset_19_is_unsupported():
    model = make_model("Pad", {"x": rand(2, 3), "pads": i64(1, 1, 1, 1)}, {"mode": "edge"}, opset=18)
    model.graph.node[0].attribute[0].s = b"wrap"
    with pytest.raises(UnsupportedOpError, match="wrap"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


@pytest.mark.parametrize("start,end", [(None, None), (1, None), (-2, -1), (-10, 10), (3, 1)])
def test_shape(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check_op("Shape", {"x": rand(2, 3, 4)}, attrs, opset=15)


def test_size():
    check_op("Size", {"x": rand(2, 3, 4)})
    check_op("Size", {"x": rand(2, 0)})


@pytest.mark.parametrize("value", [None, np.array([3], np.int32), np.array([0.5], np.float32)])
def test_constant_of_shape(value):
    from onnx import numpy_helper

    attrs = {"value": numpy_helper.from_array(value)} if value is not None else {}
    check_op("ConstantOfShape", {"shape": i64(2, 3)}, attrs)
    check_op("ConstantOfShape", {"shape": i64(0)}, attrs)


@pytest.mark.parametrize("args", [(1, 10, 3), (10, -3, -4), (5, 5, 1), (0.5, 2.0, 0.3)])
def test_range(args):
    dtype = np.float32 if isinstance(args[0], float) else np.int64
    check_op("Range", {n: np.array(v, dtype) for n, v in zip(("start", "limit", "delta"), args)})


@pytest.mark.parametrize("k", [0, 2, -1, 5])
def test_eye_like(k):
    check_op("EyeLike", {"x": rand(3, 4)}, {"k": k})
    check_op("EyeLike", {"x": rand(4, 2)}, {"k": k, "dtype": 6})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2])
def test_trilu(upper, k):
    inputs = {"x": rand(2, 3, 5)}
    if k is not None:
        inputs["k"] = np.array(k, np.int64)
    check_op("Trilu", inputs, {"upper": upper})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    check_op("DepthToSpace", {"x": rand(2, 8, 2, 3)}, {"blocksize": 2, "mode": mode})
    check_op("SpaceToDepth", {"x": rand(2, 3, 4, 6)}, {"blocksize": 2})


@pytest.mark.parametrize("shape,axes", [((3, 7), None), ((4, 2), [-2, -1]), ((5,), [1])])
def test_center_crop_pad(shape, axes):
    attrs = {"axes": axes} if axes else {}
    x = rand(2, 5, 4) if axes else rand(6, 4)
    check_op("CenterCropPad", {"x": x}, attrs, constants={"shape": i64(*shape)}, opset=18)
