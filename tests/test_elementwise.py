"""Elementwise kinds against ONNX Runtime, randomized, with broadcasting."""

import numpy as np
import pytest

from opcheck import check_op

rng = np.random.default_rng(0)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((1, 4), (3, 1))])
def test_arith_float(op, shapes):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32) + 3.0
    check_op(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_arith_int(op):
    a = rng.integers(-50, 50, (3, 4)).astype(np.int64)
    b = rng.integers(1, 9, (3, 4)).astype(np.int64)
    check_op(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op):
    a = rng.integers(0, 3, (3, 4)).astype(np.float32)
    b = rng.integers(0, 3, (4,)).astype(np.float32)
    check_op(op, {"a": a, "b": b})


def test_relu():
    check_op("Relu", {"x": rng.standard_normal((2, 5)).astype(np.float32)})
