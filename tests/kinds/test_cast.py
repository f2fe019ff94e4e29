"""Cast, CastLike and BitCast against ONNX Runtime and ONNX's reference evaluator (ml_dtypes), exactly."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.errors import ModelError, UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy warns on the inf/NaN inputs made on purpose
rng = np.random.default_rng(2)
SPECIALS = np.array([0.0, -0.0, 0.24, 0.25, 0.26, 0.75, 1.25, 2.5, 5.0, 7.5, 100.0, 300.0, 464.0, 465.0, 500.0,
                     6e4, 1e6, 1e-7, -1e-7, -3.3, -600.0, np.inf, -np.inf, np.nan], dtype=np.float32)
NARROW = [T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ, T.FLOAT4E2M1]
INTS4 = [T.INT4, T.UINT4, T.INT2, T.UINT2]


def run(model, feeds):
    return kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run(feeds)["out0"]


def check_ref(inputs, attrs, op="Cast", opset=25):
    """kiln equals the ONNX reference bit for bit (NaNs compared as NaN), in dtype and shape."""
    model = make_model(op, inputs, attrs, opset=opset)
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    got = run(model, inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    return got


def values():
    return np.concatenate([SPECIALS, rng.standard_normal(40).astype(np.float32) * 10])


@pytest.mark.parametrize("src", [np.float32, np.float16])
@pytest.mark.parametrize("to", NARROW)
@pytest.mark.parametrize("saturate", [0, 1])
def test_to_narrow_floats(src, to, saturate):
    attrs = {"to": to} if to == T.FLOAT4E2M1 else {"to": to, "saturate": saturate}
    check_ref({"x": values().astype(src)}, attrs)


@pytest.mark.parametrize("to", INTS4)
def test_to_sub_byte_ints_wraps(to):
    """Truncate toward zero, then wrap modulo 2**bits (ONNX/ml_dtypes rule)."""
    x = np.concatenate([np.arange(-20, 20, dtype=np.float32), np.array([2.7, -2.7, 7.9, -8.5], np.float32)])
    check_ref({"x": x}, {"to": to})
    check_ref({"x": np.arange(-40, 40, dtype=np.int32)}, {"to": to})


@pytest.mark.parametrize("src", [ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2,
                                 ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz,
                                 ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fn])
@pytest.mark.parametrize("to", [T.FLOAT, T.FLOAT16, T.INT8, T.UINT8])
def test_from_narrow_types(src, to):
    codes = np.arange(256, dtype=np.uint8) if np.dtype(src).itemsize == 1 else None
    x = codes.view(src) if "float8" in np.dtype(src).name else np.arange(-8, 16).astype(np.float32).astype(src)
    if to in (T.INT8, T.UINT8):
        x = x[np.isfinite(x.astype(np.float32))]
        x = x[(x.astype(np.float32) >= 0) & (x.astype(np.float32) < 100)] if to == T.UINT8 else \
            x[np.abs(x.astype(np.float32)) < 100]
    check_ref({"x": x.reshape(-1, 1)}, {"to": to})


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_to_e8m0(saturate, round_mode):
    x = np.array([0.0, 0.124, 0.25, 0.75, 1.1, 1.5, 3.0, 1e-40, 1.7e38, 3.3e38, np.inf, np.nan], np.float32)
    check_ref({"x": np.concatenate([x, np.abs(values())])}, {"to": T.FLOAT8E8M0, "saturate": saturate,
                                                               "round_mode": round_mode})


@pytest.mark.parametrize("src,to", [(np.float32, T.FLOAT16), (np.float32, T.INT32), (np.float64, T.FLOAT),
                                    (np.int64, T.FLOAT), (np.int32, T.INT8), (np.float32, T.BOOL),
                                    (np.bool_, T.FLOAT), (np.int64, T.UINT32),
                                    (np.uint8, T.UINT64), (np.int16, T.INT16)])
def test_standard(src, to):
    x = (rng.standard_normal((3, 4)) * 50).astype(src) if src != np.bool_ else rng.random((3, 4)) > 0.5
    if src == np.int64 and to == T.UINT32:
        x = np.abs(x)
    check_op("Cast", {"x": x}, {"to": to})


def test_cast1_type_name_and_castlike():
    x = values()
    model = make_model("Cast", {"x": x}, {"to": "FLOAT16"}, opset=1)  # Cast-1 names the type
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", T.FLOAT16, x.shape))
    got = run(model, {"x": x})
    np.testing.assert_array_equal(got, x.astype(np.float16))
    check_ref({"x": values()}, {"to": T.BFLOAT16})  # ORT returns no numpy type for bf16
    check_ref({"x": x, "like": np.zeros(1, ml_dtypes.float8_e5m2fnuz)}, {"saturate": 0}, op="CastLike")


def test_strings():
    check_ref({"x": np.array(["1.5", "-INF", "nan", "1e3", "+inf"], dtype=object)}, {"to": T.FLOAT})
    got = run(make_model("Cast", {"x": np.array([1.5, -2.0], np.float32)}, {"to": T.STRING}, opset=25),
              {"x": np.array([1.5, -2.0], np.float32)})
    assert got.dtype == object and list(got) == ["1.5", "-2.0"]


@pytest.mark.parametrize("src,to", [(np.float32, T.INT32), (np.int8, T.UINT8), (np.float64, T.INT64),
                                    (np.uint16, T.FLOAT16), (np.bool_, T.UINT8)])
def test_bitcast(src, to):
    x = (rng.standard_normal((2, 3)) * 100).astype(src) if src != np.bool_ else rng.random((2, 3)) > 0.5
    check_ref({"x": x}, {"to": to}, op="BitCast", opset=26)


def test_bitcast_width_mismatch_rejected():
    model = make_model("Cast", {"x": np.zeros(3, np.float32)}, {"to": T.FLOAT}, opset=26)
    model.graph.node[0].op_type = "BitCast"
    model.graph.node[0].attribute[0].CopyFrom(helper.make_attribute("to", T.INT64))
    with pytest.raises(ModelError, match="same bit.width"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


def test_unsupported_target_rejected():
    model = make_model("Cast", {"x": np.zeros(3, np.float32)}, {"to": T.FLOAT6E2M3}, opset=28)
    with pytest.raises(ModelError, match="FLOAT6E2M3"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


def test_bad_round_mode_rejected():
    model = make_model("Cast", {"x": np.zeros(3, np.float32)}, {"to": T.FLOAT8E8M0}, opset=25)
    model.graph.node[0].attribute.append(helper.make_attribute("round_mode", "sideways"))
    with pytest.raises(UnsupportedOpError, match="round_mode"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))
