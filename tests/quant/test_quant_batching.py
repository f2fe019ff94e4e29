"""Calibration / validation feeds re-batched to a network built for a fixed batch (quant/batching.py).

A static-shape build folds shape arithmetic: below, Gather(x, Range(0, N)) becomes a Gather at constant
indices 0..N-1, so a smaller calibration batch reads out of range (a device-side assert on CUDA).
"""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import InputError
from kiln.ir import DType, Network
from kiln.quant.batching import fitted

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5


def _model() -> bytes:
    g = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
         helper.make_node("Range", ["zero", "n", "one"], ["r"]),
         helper.make_node("Gather", ["x", "r"], ["g"], axis=0),
         helper.make_node("MatMul", ["g", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one"),
         numpy_helper.from_array(W, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_calibration_batches_fitted_to_the_built_batch():
    """Built for batch 4, calibrated with batches of 2 and 1 (5 samples): runs, and the minmax scale is
    the largest |x| of the given samples (the last batch is completed with samples from the start)."""
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((2, 4)).astype(np.float32)} for _ in range(2)]
    calib.append({"x": rng.standard_normal((1, 4)).astype(np.float32) * 3})
    cfg = kiln.BuildConfig.with_shapes({"x": (4, 4)}, device="cpu", int8=True, calibrator="minmax")
    engine = kiln.build(_model(), cfg, calib_data=calib)
    record = engine.build_info["int8"]
    scales = {t: v["scale"] for t, v in record["tensors"].items()}
    amax = max(float(np.abs(c["x"]).max()) for c in calib)
    assert len(scales) == 1 and next(iter(scales.values())) == pytest.approx(amax / 127, rel=1e-6)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    y = engine.create_context().run({"x": x})["y"]
    assert np.allclose(np.asarray(y), x @ W, atol=0.05)


def _net(shape) -> Network:
    net = Network()
    net.add_tensor("x", DType.FLOAT32, shape)
    net.inputs = ["x"]
    return net


def test_fitted_rebatches_and_refuses_other_sample_shapes():
    rows = [torch.full((n, 2), float(i)) for i, n in enumerate((3, 3, 1))]
    got = [b["x"] for b in fitted(_net((4, 2)), ({"x": r} for r in rows))]
    assert [tuple(b.shape) for b in got] == [(4, 2), (4, 2)]
    assert got[1][:, 0].tolist() == [1.0, 1.0, 2.0, 0.0]  # 3 left over, completed by the first sample
    short = [b["x"] for b in fitted(_net((8, 2)), [{"x": rows[0]}])]
    assert [tuple(b.shape) for b in short] == [(8, 2)]
    same = [b["x"] for b in fitted(_net(("N", 2)), [{"x": rows[0]}])]
    assert same[0] is rows[0]
    with pytest.raises(InputError, match="built for"):
        list(fitted(_net((4, 3)), [{"x": rows[0]}]))
