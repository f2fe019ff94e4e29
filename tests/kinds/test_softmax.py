"""Softmax, LogSoftmax and Hardmax against ONNX Runtime: one-axis semantics (opset 13+) and the
coerce-to-2-D semantics before opset 13."""

import numpy as np
import pytest

from opcheck import check_op

rng = np.random.default_rng(0)
OPS = ["Softmax", "LogSoftmax", "Hardmax"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_single_axis(op, axis):
    check_op(op, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}, {"axis": axis}, opset=13)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("attrs", [{}, {"axis": 0}, {"axis": 2}])
def test_coerced_2d_before_opset_13(op, attrs):
    check_op(op, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}, attrs, opset=11)


def test_hardmax_picks_first_of_ties():
    check_op("Hardmax", {"x": rng.integers(0, 2, (4, 5)).astype(np.float32)}, opset=13)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_large_values_are_stable(op):
    x = (rng.standard_normal((3, 6)) * 1000).astype(np.float32)
    check_op(op, {"x": x}, opset=13, atol=1e-4)  # LogSoftmax values reach ~1e4; 1e-4 is ~1 ulp there


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_fp16(op):
    check_op(op, {"x": rng.standard_normal((3, 40)).astype(np.float16)}, opset=13,
             rtol=1e-3, atol=1e-3)  # fp16 output: about one half-precision ulp
