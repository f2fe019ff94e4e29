"""Explicit Q/DQ models from ONNX Runtime's quantize_static run in int8 with the model's own scales and match the
model as written (onnx's ReferenceEvaluator: exact numpy arithmetic; ORT's fused integer kernels saturate on CPUs
without VNNI, so ORT is not the oracle here).

Tolerance: kiln fuses DQ → Conv/MatMul → Q into one integer layer and applies a Q/DQ point that sits between a
conv and its ReLU once, at the fused output, and adds the bias in fp32 rather than as int32; so an int8 value
may differ from ONNX Runtime's by one quantization step (LSB) in places. We judge by the largest error relative
to the output's own quantization step and by cosine similarity.
"""

import numpy as np
import onnx
import onnx.version_converter
import torch
from onnx.reference import ReferenceEvaluator
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

import kiln
from models.export import export


class _Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def _quantize(path, feeds, out):
    quantize_static(str(path), str(out), _Reader(feeds), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    return out


def _output_step(path) -> float:
    """The scale of the Q/DQ pair that ends the model (the output's quantization step)."""
    m = onnx.load(str(path))
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == m.graph.output[0].name)
    init = {i.name: onnx.numpy_helper.to_array(i) for i in m.graph.initializer}
    return float(init[dq.input[1]])


def _as_written(path, feeds) -> np.ndarray:
    """The Q/DQ model's output as written, exactly (ReferenceEvaluator implements DequantizeLinear from opset 19)."""
    model = onnx.version_converter.convert_version(onnx.load(str(path)), 21)
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _check(qpath, feeds, max_steps):
    engine = kiln.build(qpath, kiln.BuildConfig(device="cpu", int8=True))
    info = engine.build_info["int8"]
    assert "Q/DQ" in info["scales_from"]
    kinds = [layer.kind for layer in engine.network.layers]
    want = _as_written(qpath, feeds)
    got = engine.run(feeds)[engine.network.outputs[0]]
    step = _output_step(qpath)
    err = np.abs(got - want).max() / step
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert err <= max_steps and cos >= 0.999, (err, cos)
    return engine, info, kinds


def test_cnn_from_quantize_static_matches_the_model_as_written(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(16, 16, 3, padding=1, groups=4), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10))
    path = export(m, (torch.randn(2, 3, 8, 8),), tmp_path / "cnn.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}})
    g = np.random.default_rng(0)
    calib = [{"x": g.normal(size=(4, 3, 8, 8)).astype(np.float32)} for _ in range(8)]
    qpath = _quantize(path, calib, tmp_path / "cnn_qdq.onnx")
    feeds = {"x": g.normal(size=(8, 3, 8, 8)).astype(np.float32)}
    engine, info, kinds = _check(qpath, feeds, max_steps=2)
    assert kinds.count("QuantConv") == 2 and kinds.count("QuantGemm") == 1
    assert all(r["precision"] == "int8" and r["scale_source"] == "Q/DQ" for r in info["layers"].values())
    # the weights are held as int8: their bytes are a quarter of the float model's
    w8 = sum(v.numel() for v in engine.network.constants.values() if v.dtype == torch.int8)
    assert w8 >= sum(p.numel() for n, p in m.named_parameters() if n.endswith("weight"))


class _Block(torch.nn.Module):
    """A transformer-style MLP block: LayerNorm → Linear → GELU → Linear, with a residual."""

    def __init__(self, d=32):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_mlp_block_from_quantize_static_matches_the_model_as_written(tmp_path):
    torch.manual_seed(1)
    path = export(_Block(), (torch.randn(2, 5, 32),), tmp_path / "mlp.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b", 1: "s"}})
    g = np.random.default_rng(1)
    calib = [{"x": g.normal(size=(2, 5, 32)).astype(np.float32)} for _ in range(8)]
    qpath = _quantize(path, calib, tmp_path / "mlp_qdq.onnx")
    feeds = {"x": g.normal(size=(3, 7, 32)).astype(np.float32)}
    engine, info, kinds = _check(qpath, feeds, max_steps=3)
    assert kinds.count("QuantGemm") == 2, kinds


def test_qdq_model_without_int8_flag_runs_as_written(tmp_path):
    torch.manual_seed(2)
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU())
    path = export(m, (torch.randn(2, 16),), tmp_path / "l.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}})
    g = np.random.default_rng(2)
    qpath = _quantize(path, [{"x": g.normal(size=(4, 16)).astype(np.float32)} for _ in range(4)], tmp_path / "q.onnx")
    engine = kiln.build(qpath, kiln.BuildConfig(device="cpu"))
    assert not any(layer.kind.startswith("Quant") and layer.kind != "QuantizeLinear" for layer in engine.network.layers)
    assert any("add --int8" in n for n in engine.build_info["notes"])
    feeds = {"x": g.normal(size=(4, 16)).astype(np.float32)}
    want = _as_written(qpath, feeds)
    np.testing.assert_allclose(engine.run(feeds)["y"], want, atol=_output_step(qpath) * 1.01)
