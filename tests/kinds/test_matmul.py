"""Matrix-multiplication and linear-algebra kinds against ONNX Runtime, randomized."""

import numpy as np
import pytest

from kiln.frontend.onnx import import_onnx
import kiln
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("a, b", [((3, 4), (4, 5)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((4,), (4,)),
                                  ((2, 1, 3, 4), (3, 4, 2)), ((1, 2, 3), (5, 1, 3, 2))])
def test_matmul(a, b):
    check_op("MatMul", {"a": randn(*a), "b": randn(*b)})


def test_matmul_int32():
    a, b = rng.integers(-50, 50, (2, 3, 4)).astype(np.int32), rng.integers(-50, 50, (4, 2)).astype(np.int32)
    check_op("MatMul", {"a": a, "b": b})


def test_matmul_float16():
    # fp16 output: kiln accumulates in fp32 and rounds once; ORT may round differently, within fp16's 1e-3
    check_op("MatMul", {"a": randn(3, 8, dtype=np.float16), "b": randn(8, 4, dtype=np.float16)}, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (3, 1), (3, 5)])
def test_gemm(trans_a, trans_b, c_shape):
    a = randn(4, 3) if trans_a else randn(3, 4)
    b = randn(5, 4) if trans_b else randn(4, 5)
    consts = {} if c_shape is None else {"c": randn(*c_shape)}
    check_op("Gemm", {"a": a, "b": b}, {"transA": trans_a, "transB": trans_b, "alpha": 0.7, "beta": -1.3},
             constants=consts)


def test_gemm_attributes_use_onnx_names():
    """The BatchNorm folding pass reads (X, W, B) and these attribute names."""
    model = make_model("Gemm", {"a": randn(2, 3)}, {"transB": 1}, constants={"w": randn(4, 3), "c": randn(4)})
    layer = import_onnx(model).layers[0]
    assert layer.kind == "Gemm" and layer.inputs == ["a", "w", "c"]
    assert layer.attrs == {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1}


def test_matmul_integer():
    a = rng.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    b = rng.integers(-128, 128, (4, 5)).astype(np.int8)
    check_op("MatMulInteger", {"a": a, "b": b}, constants={"az": np.array(12, np.uint8),
                                                           "bz": rng.integers(-5, 5, 5).astype(np.int8)}, opset=10)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_matmul(dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, (2, 3, 4)).astype(dtype)
    b = rng.integers(info.min, info.max + 1, (4, 5)).astype(dtype)
    consts = {"as": np.array(0.05, np.float32), "az": np.array(3, dtype), "bs": np.array(0.02, np.float32),
              "bz": np.array(-2 if dtype == np.int8 else 130, dtype), "ys": np.array(0.4, np.float32),
              "yz": np.array(5, dtype)}
    check_op("QLinearMatMul", {"a": a, "b": b}, constants=consts, opset=10,
             input_order=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ii->...i", [(2, 3, 3)]),
    ("ij->ji", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("abc,cd,ae->bde", [(2, 3, 4), (4, 2), (2, 3)]),
])
def test_einsum(equation, shapes):
    check_op("Einsum", {f"x{i}": randn(*s) for i, s in enumerate(shapes)}, {"equation": equation}, opset=12)


def test_einsum_int64():
    check_op("Einsum", {"a": rng.integers(-9, 9, (3, 4)), "b": rng.integers(-9, 9, (4, 2))},
             {"equation": "ij,jk->ik"}, opset=12)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2)])
def test_det(shape):
    check_op("Det", {"x": randn(*shape)}, opset=11)


def test_matmul_integer_where_int16_pair_sums_would_saturate():
    """255 × -128 twice is -65280: a kernel that sums product pairs in int16 saturates; kiln must not."""
    a = np.full((2, 8), 255, np.uint8)
    b = np.stack([np.full(8, -128), np.full(8, 127), np.arange(8) * 36 - 128], axis=1).astype(np.int8)
    want = a.astype(np.int32) @ b.astype(np.int32)
    assert want.min() < np.iinfo(np.int16).min < np.iinfo(np.int16).max < want.max()  # both ways past int16
    model = make_model("MatMulInteger", {"a": a}, constants={"b": b}, opset=10)
    got = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run({"a": a})["out0"]
    np.testing.assert_array_equal(got, want)
