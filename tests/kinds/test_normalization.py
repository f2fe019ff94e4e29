"""Normalization kinds against ONNX Runtime, randomized, plus the clear errors for what kiln rejects."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import kiln
from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx import import_onnx
from kiln.kinds import run_reference
from opcheck import DEVICE, check_op, make_model, run_both

rng = np.random.default_rng(0)


def _randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _declared(model, *shapes):
    """Type the float outputs that ONNX shape inference leaves blank (function ops), as exporters do."""
    for out, shape in zip(model.graph.output, shapes):
        out.CopyFrom(helper.make_tensor_value_info(out.name, TensorProto.FLOAT, shape))
    return model


def _bn_params(c):
    return {"scale": _randn(c), "bias": _randn(c), "mean": _randn(c),
            "var": rng.uniform(0.5, 1.5, c).astype(np.float32)}


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4, 5)])
def test_batchnorm_inference(shape):
    check_op("BatchNormalization", {"x": _randn(*shape)}, {"epsilon": 1e-3}, constants=_bn_params(shape[1]),
             opset=15)


def test_batchnorm_old_opset():
    check_op("BatchNormalization", {"x": _randn(2, 3, 4)}, constants=_bn_params(3), opset=7)


def test_batchnorm_training_mode_outputs():
    check_op("BatchNormalization", {"x": _randn(4, 3, 5)}, {"training_mode": 1, "momentum": 0.8},
             constants=_bn_params(3), n_outputs=3, opset=15)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layernorm_all_outputs(axis):
    normalized = (2, 3, 4)[axis % 3:]
    check_op("LayerNormalization", {"x": _randn(2, 3, 4)}, {"axis": axis},
             constants={"scale": _randn(*normalized), "bias": _randn(*normalized)}, n_outputs=3, opset=17)


def test_layernorm_without_bias():
    check_op("LayerNormalization", {"x": _randn(3, 8), "scale": _randn(8)}, opset=17)


def test_layernorm_fp16_stashes_fp32():
    x = (rng.standard_normal((4, 64)) * 4 + 30).astype(np.float16)  # large mean: fp16 statistics would lose it
    check_op("LayerNormalization", {"x": x, "scale": np.ones(64, np.float16)}, n_outputs=3, opset=17,
             rtol=2e-3, atol=2e-3)  # fp16 output: about one half-precision ulp


@pytest.mark.parametrize("axis", [-1, 1])
def test_rmsnorm(axis):
    check_op("RMSNormalization", {"x": _randn(2, 3, 4), "scale": _randn(*(2, 3, 4)[axis % 3:])}, {"axis": axis},
             opset=23)


def test_groupnorm():
    feeds = {"x": _randn(2, 6, 3, 3)}
    model = _declared(make_model("GroupNormalization", feeds, {"num_groups": 2, "epsilon": 1e-4}, opset=21,
                                 constants={"scale": _randn(6), "bias": _randn(6)}), (2, 6, 3, 3))
    want, got = run_both(model, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_groupnorm_18_affine_is_per_group():
    """ONNX's checker refuses opset-18 GroupNormalization (deprecated), so import and run the kind directly."""
    model = _declared(make_model("GroupNormalization", {"x": _randn(2, 6, 3)}, {"num_groups": 3}, opset=18,
                                 constants={"scale": _randn(3), "bias": _randn(3)}), (2, 6, 3))
    layer = import_onnx(model).layers[0]
    assert layer.attrs["group_affine"] is True
    x, scale, bias = torch.randn(2, 6, 3), torch.randn(3), torch.randn(3)
    got = run_reference("GroupNormalization", [x, scale, bias], layer.attrs)[0]
    per_channel = {**layer.attrs, "group_affine": False}
    channel_params = [scale.repeat_interleave(2), bias.repeat_interleave(2)]
    want = run_reference("GroupNormalization", [x, *channel_params], per_channel)[0]
    torch.testing.assert_close(got, want)


def test_instancenorm():
    check_op("InstanceNormalization", {"x": _randn(2, 3, 4, 5), "scale": _randn(3), "bias": _randn(3)},
             {"epsilon": 1e-3}, opset=17)


def test_lrn():
    check_op("LRN", {"x": _randn(2, 6, 3, 3)}, {"size": 3, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, opset=13)


def test_lrn_even_size_window():
    """ORT rejects even sizes; the spec's window is c-⌊(size-1)/2⌋ .. c+⌈(size-1)/2⌉, checked directly."""
    x = _randn(1, 5, 2, 2)
    model = make_model("LRN", {"x": x}, {"size": 4, "alpha": 0.4, "beta": 0.75, "bias": 1.0}, opset=13)
    got = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run({"x": x})["out0"]
    want = np.stack([x[:, c] / (1.0 + 0.1 * (x[:, max(0, c - 1):c + 3] ** 2).sum(1)) ** 0.75 for c in range(5)], 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p,axis", [(1, 0), (2, -1), (2, 1)])
def test_lpnormalization(p, axis):
    check_op("LpNormalization", {"x": _randn(3, 4, 5)}, {"p": p, "axis": axis}, opset=17)


@pytest.mark.parametrize("axes", [[0, 2, 3], [1, -1]])
def test_mvn(axes):
    check_op("MeanVarianceNormalization", {"x": _randn(2, 3, 4, 5)}, {"axes": axes}, opset=13)


def _import(*args, **kw):
    kiln.build(make_model(*args, **kw), kiln.BuildConfig(device=DEVICE))


def test_rejects_lp_order_3():
    with pytest.raises(UnsupportedOpError, match="p=3"):
        _import("LpNormalization", {"x": _randn(2, 3)}, {"p": 3}, opset=17)


def test_rejects_integer_stash_type():
    with pytest.raises(UnsupportedOpError, match="stash_type=7"):
        _import("LayerNormalization", {"x": _randn(2, 3), "scale": _randn(3)}, {"stash_type": 7}, opset=17)


def test_rejects_non_spatial_batchnorm():
    with pytest.raises(UnsupportedOpError, match="spatial=0"):
        _import("BatchNormalization", {"x": _randn(2, 3)}, {"spatial": 0}, constants=_bn_params(3), opset=7)


def test_rejects_training_outputs_before_opset_14():
    with pytest.raises(UnsupportedOpError, match="training-mode outputs"):
        model = make_model("BatchNormalization", {"x": _randn(2, 3)}, constants=_bn_params(3), n_outputs=5, opset=9)
        kiln.build(_declared(model, (2, 3), *[(3,)] * 4), kiln.BuildConfig(device=DEVICE))
