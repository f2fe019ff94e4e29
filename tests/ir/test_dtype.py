"""The dtype system: ONNX/numpy/torch mappings, runtime representation round trips, input checking."""

import ml_dtypes
import numpy as np
import pytest
import torch
from onnx import TensorProto as T

from kiln.errors import InputError, ModelError
from kiln.ir import DType, Tensor
from kiln.ir.dtype import to_numpy, to_torch
from kiln.runtime.io import check_feeds

ML = ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
      "float4_e2m1fn", "int4", "uint4", "int2", "uint2"]


@pytest.mark.parametrize("d", list(DType))
def test_onnx_code_round_trip(d):
    assert DType.from_onnx(d.onnx) is d
    assert DType(d.value) is d


def test_unknown_onnx_type_is_a_model_error():
    with pytest.raises(ModelError, match="FLOAT6E2M3"):
        DType.from_onnx(T.FLOAT6E2M3)


@pytest.mark.parametrize("name", ML)
def test_ml_dtypes_round_trip(name):
    """numpy → runtime torch → numpy keeps type and every value (the sub-byte ints sign-extended)."""
    dt = np.dtype(getattr(ml_dtypes, name))
    x = np.arange(256, dtype=np.uint8).view(dt) if dt.name.startswith("float8") \
        else np.arange(-4, 8, dtype=np.float32).astype(dt).reshape(3, 4)
    t = to_torch(x)
    d = DType.from_numpy(dt)
    assert DType.from_torch(t.dtype) is d and d.itemsize == dt.itemsize
    back = to_numpy(t)
    assert back.dtype == dt
    np.testing.assert_array_equal(back.astype(np.float64), x.astype(np.float64))
    np.testing.assert_array_equal(to_numpy(t[..., ::2]).astype(np.float64), x[..., ::2].astype(np.float64))


@pytest.mark.parametrize("name", ["bfloat16", "int4", "float8_e8m0fnu"])
def test_scalar_keeps_rank_zero(name):
    x = np.array(2.0, np.float32).astype(getattr(ml_dtypes, name))
    assert to_torch(x).shape == () and to_numpy(to_torch(x)).shape == ()


def test_sub_byte_carrier_holds_the_value():
    t = to_torch(np.array([-3, 7], ml_dtypes.int4))
    assert t.dtype == torch.int4 and t.view(DType.INT4.carrier).tolist() == [-3, 7]
    assert DType.INT4.bits == 4 and DType.INT4.int_range == (-8, 7) and DType.UINT2.int_range == (0, 3)
    codes = to_torch(np.array([-3.0, 1.5], np.float32).astype(ml_dtypes.float4_e2m1fn))
    assert codes.view(DType.FP4E2M1.carrier).tolist() == [0b1101, 0b0011]


def test_string():
    assert DType.from_onnx(T.STRING) is DType.STRING and DType.STRING.torch is None
    x = np.array(["a", "bc"])
    v = to_torch(x)
    assert isinstance(v, np.ndarray) and v.dtype == object and DType.from_torch(v.dtype) is DType.STRING
    assert to_numpy(v) is v and DType.from_numpy(x.dtype) is DType.STRING


def test_check_feeds_converts_and_checks_types():
    inputs = [Tensor("q", DType.INT4, (2,)), Tensor("s", DType.STRING, (2,)), Tensor("f", DType.FLOAT32, ())]
    feeds = {"q": np.array([1, -2], ml_dtypes.int4), "s": np.array(["x", "y"]), "f": np.float32(2.0)}
    out, was_numpy = check_feeds(feeds, inputs, ())
    assert was_numpy and out["q"].dtype == torch.int4 and out["s"].dtype == object and out["f"].shape == ()
    with pytest.raises(InputError, match="expected dtype int4, got int8"):
        check_feeds(feeds | {"q": np.array([1, -2], np.int8)}, inputs, ())
