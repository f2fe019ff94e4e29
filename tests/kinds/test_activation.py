"""Activation kinds against ONNX Runtime, randomized, with their attributes."""

import numpy as np
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(1)


def x(*shape):
    return (rng.standard_normal(shape) * 3).astype(np.float32)


CASES = [
    ("Relu", {}, 14), ("LeakyRelu", {"alpha": 0.2}, 16), ("Elu", {"alpha": 0.7}, 6), ("Selu", {}, 6),
    ("Selu", {"alpha": 1.5, "gamma": 2.0}, 6), ("Celu", {"alpha": 0.5}, 12), ("ThresholdedRelu", {"alpha": 0.8}, 10),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 6), ("HardSwish", {}, 14), ("Sigmoid", {}, 13), ("Tanh", {}, 13),
    ("Softplus", {}, 1), ("Softsign", {}, 1), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
    ("Mish", {}, 18), ("Shrink", {"lambd": 1.0, "bias": 0.5}, 9),
]


@pytest.mark.parametrize("op,attrs,opset", CASES)
def test_activation(op, attrs, opset):
    check_op(op, {"x": x(2, 3, 4)}, attrs, opset=opset)


def test_swish():
    """ORT 1.32 has no Swish-24 kernel: compare with x * sigmoid(alpha * x) directly."""
    v = x(3, 4)
    model = make_model("Swish", {"x": v}, {"alpha": 0.5}, opset=24)
    got = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run({"x": v})["out0"]
    np.testing.assert_allclose(got, v / (1 + np.exp(-0.5 * v)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("slope_shape", [(1,), (4,), (3, 1), (2, 3, 4)])
def test_prelu(slope_shape):
    check_op("PRelu", {"x": x(2, 3, 4), "slope": rng.uniform(0, 1, slope_shape).astype(np.float32)})


def test_relu_int_and_shrink_int():
    check_op("Relu", {"x": rng.integers(-5, 5, (3, 4)).astype(np.int32)}, opset=14)
    check_op("Shrink", {"x": rng.integers(-5, 5, (3, 4)).astype(np.int32)}, {"lambd": 1.5, "bias": 1.0})


def test_gelu_bad_approximation_rejected():
    model = make_model("Gelu", {"x": x(2, 3)}, opset=20)
    model.graph.node[0].attribute.append(__import__("onnx").helper.make_attribute("approximate", "erf"))
    with pytest.raises(UnsupportedOpError, match="approximate"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


def test_prelu_opset6_slope_per_channel():
    """Before opset 7 a 1-D slope of C values applies along axis 1."""
    v, slope = x(2, 3, 4), np.array([0.1, 0.2, 0.3], np.float32)
    model = make_model("PRelu", {"x": v}, constants={"slope": slope}, opset=6)
    got = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run({"x": v})["out0"]
    np.testing.assert_allclose(got, np.where(v < 0, v * slope[:, None], v), rtol=1e-6)
