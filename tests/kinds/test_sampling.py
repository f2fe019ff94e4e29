"""Random kinds: output types and shapes as ONNX Runtime gives them, distributions, seeds.

Values cannot be compared with ONNX Runtime (different generators), so these tests check what any
correct sampler satisfies: ranges, sample statistics (at 5+ standard errors) and determinism under a seed.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import ModelError
from kiln.ir.dtype import to_numpy
from opcheck import DEVICE, make_model, run_both

rng = np.random.default_rng(0)


def run(op, feeds=None, attrs=None, runs=1, **kw):
    """kiln's outputs of `runs` runs, after checking dtype and shape against ONNX Runtime where it has the op."""
    feeds = feeds or {}
    model = make_model(op, feeds, attrs, **kw)
    if (attrs or {}).get("dtype") != TensorProto.FLOAT16:  # ONNX Runtime has no fp16 random ops
        want, got = run_both(model, feeds)
        assert to_numpy(got[0]).dtype == want[0].dtype and got[0].shape == want[0].shape
    ctx = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context()
    # an engine without inputs has no numpy feeds to follow: it returns torch tensors
    return [to_numpy(ctx.run(feeds)[model.graph.output[0].name]) for _ in range(runs)]


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_random_uniform(dtype):
    (y,) = run("RandomUniform", attrs={"shape": [200, 50], "low": -2.0, "high": 3.0, "dtype": dtype})
    assert y.dtype == helper.tensor_dtype_to_np_dtype(dtype)
    assert y.min() >= -2 and y.max() <= 3
    assert abs(y.astype(np.float64).mean() - 0.5) < 5 * 5 / np.sqrt(12 * y.size)


def test_random_normal():
    (y,) = run("RandomNormal", attrs={"shape": [100, 100], "mean": 1.5, "scale": 2.0})
    assert abs(y.mean() - 1.5) < 5 * 2 / 100 and abs(y.std() - 2.0) < 0.1


def test_seed_repeats_and_no_seed_varies():
    seeded = run("RandomNormal", attrs={"shape": [64], "seed": 3.0}, runs=2)
    np.testing.assert_array_equal(seeded[0], seeded[1])
    again = run("RandomNormal", attrs={"shape": [64], "seed": 3.0})
    np.testing.assert_array_equal(seeded[0], again[0])
    free = run("RandomNormal", attrs={"shape": [64]}, runs=2)
    assert not np.array_equal(free[0], free[1])


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomNormalLike"])
@pytest.mark.parametrize("attrs", [{}, {"dtype": TensorProto.DOUBLE}])
def test_like(op, attrs):
    (y,) = run(op, {"x": np.zeros((3, 4, 5), np.float32)}, attrs)
    assert y.shape == (3, 4, 5) and np.unique(y).size > 50


def test_like_rejects_integer_output():
    model = make_model("RandomUniformLike", {"x": np.zeros((3,), np.int32)})
    with pytest.raises(ModelError, match="unsupported type tensor.int32"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


@pytest.mark.parametrize("attrs", [{}, {"dtype": TensorProto.INT32}, {"dtype": TensorProto.BOOL, "seed": 1.0}])
def test_bernoulli(attrs):
    p = np.tile(np.array([0.0, 1.0, 0.3], np.float32), 4000)
    (y,) = run("Bernoulli", {"p": p}, attrs, opset=15)
    y = y.astype(np.float64)
    assert (y[0::3] == 0).all() and (y[1::3] == 1).all()
    assert abs(y[2::3].mean() - 0.3) < 5 * np.sqrt(0.21 / 4000)


@pytest.mark.parametrize("attrs", [{}, {"dtype": TensorProto.INT64, "seed": 7.0}])
def test_multinomial(attrs):
    logits = np.log(np.array([[0.2, 0.5, 0.3], [1e-9, 1e-9, 1.0]], np.float32))
    (y,) = run("Multinomial", {"x": logits}, {"sample_size": 5000, **attrs})
    assert (y[1] == 2).all()
    freq = np.bincount(y[0], minlength=3) / 5000
    np.testing.assert_allclose(freq, [0.2, 0.5, 0.3], atol=5 * np.sqrt(0.25 / 5000))
