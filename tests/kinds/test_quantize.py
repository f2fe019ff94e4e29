"""Quantization kinds against ONNX Runtime, randomized: per-tensor, per-axis, blocked, narrow types."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opcheck import ORT_IR, check_op, run_both

rng = np.random.default_rng(0)


def randn(*shape):
    return (rng.standard_normal(shape) * 4).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor(dtype):
    zp = np.array(3 if np.iinfo(dtype).min < 0 else 100, dtype)
    check_op("QuantizeLinear", {"x": randn(3, 4) * 20}, constants={"s": np.array(0.07, np.float32), "z": zp},
             opset=21)


def test_quantize_rounds_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 1000.0, -1000.0], np.float32)
    check_op("QuantizeLinear", {"x": x}, constants={"s": np.array(1.0, np.float32), "z": np.array(0, np.int8)})


def test_quantize_default_uint8_without_zero_point():
    check_op("QuantizeLinear", {"x": randn(2, 5)}, constants={"s": np.array(0.05, np.float32)}, opset=13)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_axis(axis):
    x = randn(3, 4, 5)
    n = x.shape[axis]
    check_op("QuantizeLinear", {"x": x}, {"axis": axis},
             constants={"s": rng.uniform(0.02, 0.1, n).astype(np.float32),
                        "z": rng.integers(-10, 10, n).astype(np.int8)}, opset=13)


def test_quantize_blocked():
    x = randn(4, 6)
    check_op("QuantizeLinear", {"x": x}, {"axis": 1, "block_size": 4},
             constants={"s": rng.uniform(0.02, 0.1, (4, 2)).astype(np.float32),
                        "z": rng.integers(-10, 10, (4, 2)).astype(np.int8)}, opset=21)


def qdq_model(x_shape, zp: np.ndarray, q_attrs: dict, opset: int, scale=0.5) -> onnx.ModelProto:
    """x → QuantizeLinear → DequantizeLinear → float y: narrow types checked through ORT, whose Python
    API cannot return int4/fp8 arrays."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **q_attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array(scale, np.float32), "s"), onnx.numpy_helper.from_array(zp, "z")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ORT_IR)


def check_qdq(x: np.ndarray, zp: np.ndarray, q_attrs: dict | None = None, opset: int = 21, scale=0.5):
    (want,), (got,) = run_both(qdq_model(list(x.shape), zp, q_attrs or {}, opset, scale), {"x": x})
    np.testing.assert_array_equal(got, want)  # values on the quantized grid: exact


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_quantize_int4(dtype):
    check_qdq(randn(3, 4), np.array(1, dtype))


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(dtype, saturate):
    x = np.concatenate([randn(10) * 100, [1e5, -1e5, 470.0, 460.0, np.inf, -np.inf]]).astype(np.float32)
    check_qdq(x, np.array(0, dtype), {"saturate": saturate}, opset=19)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32])
def test_dequantize_per_tensor(dtype):
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -30000), min(info.max, 30000) + 1, (3, 4)).astype(dtype)
    consts = {"s": np.array(0.03, np.float32)} | ({} if dtype == np.int32 else {"z": np.array(7, dtype)})
    check_op("DequantizeLinear", {"x": x}, constants=consts, opset=21)


def test_dequantize_per_axis():
    x = rng.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    check_op("DequantizeLinear", {"x": x}, {"axis": 1},
             constants={"s": rng.uniform(0.01, 0.1, 3).astype(np.float32),
                        "z": rng.integers(-5, 5, 3).astype(np.int8)}, opset=13)


def test_dequantize_blocked_int4():
    """The scale is the graph input here: ORT cannot be fed int4 arrays."""
    x = rng.integers(-8, 8, (3, 6)).astype(ml_dtypes.int4)
    check_op("DequantizeLinear", {"s": rng.uniform(0.01, 0.1, (2, 6)).astype(np.float32)},
             {"axis": 0, "block_size": 2}, opset=21, input_order=["x", "s", "z"],
             constants={"x": x, "z": rng.integers(-2, 2, (2, 6)).astype(ml_dtypes.int4)})


def test_dequantize_float8_to_float16():
    x = randn(10).astype(ml_dtypes.float8_e4m3fn)
    check_op("DequantizeLinear", {"s": np.array(0.25, np.float16)}, constants={"x": x}, opset=21,
             input_order=["x", "s"])


def test_dynamic_quantize_linear():
    check_op("DynamicQuantizeLinear", {"x": randn(3, 7) + 2}, n_outputs=3, opset=11)


def test_dynamic_quantize_linear_all_zero():
    check_op("DynamicQuantizeLinear", {"x": np.zeros((2, 3), np.float32)}, n_outputs=3, opset=11)
