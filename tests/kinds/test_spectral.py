"""Spectral kinds (DFT, STFT, windows, MelWeightMatrix) against ONNX Runtime, randomized."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import ModelError
from opcheck import DEVICE, check_op, make_model, run_both

rng = np.random.default_rng(0)
# FFTs of up to 16 points in fp32: sums of 16 terms of magnitude ~1 differ by a few ulps between FFT libraries.
TOL = dict(rtol=1e-4, atol=1e-4)


def signal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def typed(model: onnx.ModelProto, *types) -> onnx.ModelProto:
    """Declare output types that ONNX inference cannot give (they depend on input values)."""
    for out, (elem, rank) in zip(model.graph.output, types):
        out.CopyFrom(helper.make_tensor_value_info(out.name, elem, [f"d{i}" for i in range(rank)]))
    return model


def check_model(model, feeds, **tol):
    want, got = run_both(model, feeds)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, **tol)


# (attributes, last dim): ONNX admits one-sided forward DFTs of real input, inverse ones of complex input only.
@pytest.mark.parametrize("attrs, last", [({}, 1), ({}, 2), ({"onesided": 1}, 1), ({"inverse": 1}, 1),
                                         ({"inverse": 1}, 2), ({"axis": 2}, 2), ({"inverse": 1, "onesided": 1}, 2)])
def test_dft_17(attrs, last):
    check_op("DFT", {"x": signal(2, 6, 5, last)}, attrs, **TOL)


@pytest.mark.parametrize("length", [4, 9])
def test_dft_length_truncates_or_pads(length):
    check_op("DFT", {"x": signal(3, 6, 2)}, {"axis": 1}, constants={"n": np.array(length, np.int64)}, **TOL)


@pytest.mark.parametrize("axis", [1, -2, 0])
@pytest.mark.parametrize("attrs", [{}, {"onesided": 1}, {"inverse": 1}])
def test_dft_20_axis_input(axis, attrs):
    x = signal(4, 6, 1)
    model = typed(make_model("DFT", {"x": x, "axis": np.array(axis, np.int64)}, attrs, opset=20,
                             input_order=["x", "", "axis"]), (TensorProto.FLOAT, 3))
    check_model(model, {"x": x, "axis": np.array(axis, np.int64)}, **TOL)


def test_dft_rejects_bad_complex_dim():
    model = make_model("DFT", {"x": signal(2, 6, 3)}, {"axis": 1})
    with pytest.raises(ModelError, match="last dimension must be 1"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_window(onesided):
    x = signal(2, 40, 1)
    window = np.hanning(8).astype(np.float32)
    check_op("STFT", {"x": x}, {"onesided": onesided}, constants={"step": np.array(3, np.int64), "w": window},
             **TOL)


def test_stft_frame_length_complex():
    x = signal(1, 30, 2)
    check_op("STFT", {"x": x}, {"onesided": 0}, constants={"step": np.array(4, np.int64),
                                                           "n": np.array(6, np.int64)},
             input_order=["x", "step", "", "n"], **TOL)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("out", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows(op, periodic, out):
    size = np.array(11, np.int32)
    model = typed(make_model(op, {"size": size}, {"periodic": periodic, "output_datatype": out}), (out, 1))
    check_model(model, {"size": size}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args", [(8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 20.0, 7000.0),
                                  (5, 33, 8000, 100.0, 3000.0)])
def test_mel_weight_matrix(args):
    feeds = {k: np.array(v, t) for k, v, t in zip(["bins", "dft", "rate", "lo", "hi"], args,
                                                   [np.int32] * 3 + [np.float32] * 2)}
    model = typed(make_model("MelWeightMatrix", feeds), (TensorProto.FLOAT, 2))
    check_model(model, feeds, rtol=1e-5, atol=1e-6)
