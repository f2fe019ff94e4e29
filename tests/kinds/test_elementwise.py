"""Elementwise kinds against ONNX Runtime (and ONNX's reference evaluator for types ORT lacks), randomized."""

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.errors import KilnError, UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)
UNSIGNED = [np.uint8, np.uint16, np.uint32, np.uint64]


def check_ref(op, inputs, attrs=None, **kw):
    """Assert kiln matches ONNX's reference evaluator exactly (used for integer types ORT does not cover)."""
    model = make_model(op, inputs, attrs, **kw)
    want = ReferenceEvaluator(model).run(None, inputs)
    got = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run(inputs)
    for w, g in zip(want, [got[o.name] for o in model.graph.output]):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def floats(*shape, lo=-3.0, hi=3.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((1, 4), (3, 1))])
def test_arith_float(op, shapes):
    a = floats(*shapes[0], lo=0.5) if op == "Pow" else floats(*shapes[0])
    b = floats(*shapes[1]) + (3.0 if op == "Div" else 0.0)
    check_op(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_arith_int(op, dtype):
    a = rng.integers(-100, 100, (3, 4)).astype(dtype)
    b = rng.integers(1, 9, (3, 4)).astype(dtype) * rng.choice([-1, 1], (3, 4)).astype(dtype)
    check_op(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Less", "GreaterOrEqual", "Equal"])
@pytest.mark.parametrize("dtype", UNSIGNED)
def test_unsigned(op, dtype):
    """Wrap-around, unsigned division and ordering, including values with the top bit set."""
    top = np.iinfo(dtype).max
    a = np.array([0, 1, 7, top, top - 5, top // 2 + 3], dtype=dtype)
    b = np.array([1, 3, 7, 2, top, top // 2 + 1], dtype=dtype)
    check_ref(op, {"a": a, "b": b}, opset=18)


@pytest.mark.parametrize("fmod,dtype", [(0, np.int32), (1, np.int32), (0, np.int64), (1, np.int64), (1, np.float32)])
def test_mod(fmod, dtype):
    a = (rng.standard_normal((3, 4)) * 10).astype(dtype)
    b = rng.integers(1, 5, (4,)).astype(dtype) * np.array([1, -1, 1, -1], dtype=dtype)
    check_op("Mod", {"a": a, "b": b}, {"fmod": fmod})


@pytest.mark.parametrize("types", [(np.int32, np.float32), (np.int64, np.int64), (np.float32, np.int64)])
def test_pow_mixed(types):
    check_op("Pow", {"x": rng.integers(1, 4, (2, 3)).astype(types[0]), "y": rng.integers(0, 3, (3,)).astype(types[1])})


UNARY = ["Neg", "Abs", "Ceil", "Floor", "Round", "Exp", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh",
         "Erf", "Sign", "Reciprocal"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    check_op(op, {"x": floats(3, 5) + 0.1}, opset=18)


@pytest.mark.parametrize("op,lo,hi", [("Sqrt", 0.01, 4), ("Log", 0.01, 4), ("Asin", -0.99, 0.99),
                                      ("Acos", -0.99, 0.99), ("Atanh", -0.99, 0.99), ("Acosh", 1.01, 4)])
def test_unary_domain(op, lo, hi):
    check_op(op, {"x": floats(3, 5, lo=lo, hi=hi)}, opset=18)


def test_round_half_to_even():
    check_op("Round", {"x": np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4999], dtype=np.float32)})


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
def test_unary_int(op):
    check_op(op, {"x": rng.integers(-9, 9, (3, 4)).astype(np.int32)})


@pytest.mark.parametrize("attrs", [{}, {"detect_negative": 0}, {"detect_positive": 0}])
def test_isinf_isnan(attrs):
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0], dtype=np.float32)
    check_op("IsInf", {"x": x}, attrs)
    check_op("IsNaN", {"x": x})


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op):
    a = rng.integers(0, 3, (3, 4)).astype(np.float32)
    b = rng.integers(0, 3, (4,)).astype(np.float32)
    check_op(op, {"a": a, "b": b})


def test_equal_string():
    check_ref("Equal", {"a": np.array(["x", "yz", ""], dtype=object), "b": np.array(["x"], dtype=object)}, opset=19)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check_op(op, {"a": rng.random((2, 3, 4)) > 0.5, "b": rng.random((3, 1)) > 0.5})
    check_op("Not", {"a": rng.random((2, 3)) > 0.5})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32] + UNSIGNED)
def test_bitwise(op, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (4,), dtype=dtype, endpoint=True)
    check_ref(op, {"a": a, "b": b}, opset=18)
    check_ref("BitwiseNot", {"a": a}, opset=18)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", UNSIGNED)
def test_bitshift(direction, dtype):
    bits = 8 * np.dtype(dtype).itemsize
    x = np.array([1, 3, np.iinfo(dtype).max, 1 << (bits - 1), 5], dtype=dtype)
    n = np.array([0, 1, 3, bits - 1, 2], dtype=dtype)
    check_ref("BitShift", {"x": x, "n": n}, {"direction": direction})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 3])
def test_variadic(op, n):
    shapes = [(2, 3, 4), (3, 1), (4,)][:n]
    check_op(op, {f"x{i}": floats(*s) for i, s in enumerate(shapes)})


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_variadic_int(op):
    check_op(op, {"a": rng.integers(-9, 9, (3, 4)).astype(np.int64), "b": rng.integers(-9, 9, (4,)).astype(np.int64)})


@pytest.mark.parametrize("bounds", [("lo", "hi"), ("lo", ""), ("", "hi"), (), ("hi", "lo")])
def test_clip(bounds):
    consts = {"lo": np.array(-0.5, np.float32), "hi": np.array(1.0, np.float32)}
    order = ["x"] + [b for b in bounds]
    check_op("Clip", {"x": floats(3, 4)}, constants={k: consts[k] for k in bounds if k}, input_order=order)


def test_clip_int_and_legacy():
    check_op("Clip", {"x": rng.integers(-20, 20, (5,)).astype(np.int8)}, constants={"lo": np.array(-3, np.int8)})
    check_op("Clip", {"x": floats(3, 4)}, {"min": -0.2, "max": 0.7}, opset=6)


def test_where():
    c = rng.random((3, 4)) > 0.5
    check_op("Where", {"c": c, "x": floats(3, 4), "y": floats(4)})
    check_ref("Where", {"c": c, "x": np.arange(12, dtype=np.uint64).reshape(3, 4),
                        "y": np.array([2**64 - 1], np.uint64)})


def test_identity_and_legacy_add():
    check_op("Identity", {"x": floats(2, 3)})
    check_ref("Add", {"a": floats(2, 3), "b": floats(3)}, {"broadcast": 1}, opset=6)


def test_legacy_broadcast_axis_rejected():
    model = make_model("Add", {"a": floats(2, 3, 4), "b": floats(3)}, {"broadcast": 1, "axis": 1}, opset=6)
    with pytest.raises(UnsupportedOpError, match="legacy broadcast"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


def _dropout_model(ratio, training, seed=None):
    attrs = {} if seed is None else {"seed": seed}
    return make_model("Dropout", {"x": floats(3, 4)}, attrs, n_outputs=2, opset=13,
                      constants={"r": np.array(ratio, np.float32), "t": np.array(training)})


def test_dropout_inference():
    check_op("Dropout", {"x": floats(3, 4)}, n_outputs=2, opset=13)
    check_op("Dropout", {"x": floats(3, 4)}, {"ratio": 0.3}, opset=10)
    x = floats(3, 4)
    out = kiln.build(_dropout_model(0.0, True), kiln.BuildConfig(device=DEVICE)).create_context().run({"x": x})
    np.testing.assert_array_equal(out["out0"], x)
    assert out["out1"].dtype == bool and out["out1"].all()


def test_dropout_seeded_training_matches_onnx_reference():
    model = _dropout_model(0.5, True, seed=3)
    x = floats(3, 4)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run({"x": x})
    np.testing.assert_allclose(got["out0"], want[0], rtol=1e-6)
    np.testing.assert_array_equal(got["out1"], want[1])


def test_dropout_random_training_rejected():
    with pytest.raises(UnsupportedOpError, match="training_mode"):
        kiln.build(_dropout_model(0.5, True), kiln.BuildConfig(device=DEVICE))
    model = make_model("Dropout", {"x": floats(3, 4), "r": np.array(0.5, np.float32), "t": np.array(True)}, opset=13)
    engine = kiln.build(model, kiln.BuildConfig(device=DEVICE))
    with pytest.raises(KilnError, match="no seed"):
        engine.create_context().run({"x": floats(3, 4), "r": np.array(0.5, np.float32), "t": np.array(True)})


def test_onnx_opsets_register():
    """Every op is importable at the opset where its semantics begin and at the newest one."""
    from kiln.frontend.onnx.registry import lookup

    for op in ["Add", "Mod", "BitShift", "BitwiseNot", "IsInf", "Clip", "Where", "Dropout"]:
        assert lookup("", op, onnx.defs.onnx_opset_version()) is not None
