"""--fp8 (e4m3) on the CPU: scales and rounding by hand, the QuantGemm / QuantConv references, fp8 builds of a small
MLP and CNN against fp32, the flags' rules and errors, and what the build and `kiln inspect` report.

Tolerances: e4m3 keeps 3 mantissa bits, so each quantized tensor carries a relative RMS error of about 2.5%
(int8 with a calibrated range: about 1% of the range); fp8 engines of these random-weight models measure a mean
per-sample cosine vs fp32 of 0.998 (MLP) and 0.9989 (CNN), int8 0.9998 / 0.9999. The tests ask for 0.995 / 0.997.
"""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import kiln
from kiln.target.device import Device
from kiln.cli.app import app
from kiln.errors import ConfigError
from kiln.kinds import run_reference
from kiln.kinds.qtype import FP8, INT8
from kiln.quant.fp8 import check_fp8
from kiln.quant.report import layer_precisions, size_breakdown
from kiln.quant.scheme import QuantScales, TensorScale, for_qtype, quantize_weight, scale_from_amax
from models.export import export

F8 = torch.float8_e4m3fn
FP8_ATTRS = {"qtype": "fp8e4m3", "activation": "none", "activation_params": []}


def _cosine(a, b) -> float:
    a, b = (np.asarray(v, np.float64).reshape(len(v), -1) for v in (a, b))
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).mean())


def _f8(g, *shape, s=30.0):
    return (torch.randn(*shape, generator=g) * s).clamp(-448, 448).to(F8)


def test_fp8_weight_scale_and_rounding_by_hand():
    """scale[c] = amax_c / 448; w / scale rounds to the nearest e4m3 value, ties to even, subnormals at 2⁻⁹."""
    w = torch.tensor([[1.0, -2.0, 0.5, 0.0], [448.0, 17.0, 19.0, -0.001], [0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_weight(w, 0, FP8)
    assert q.dtype == F8 and s.dtype == torch.float32
    assert s.tolist() == pytest.approx([2 / 448, 1.0, 2.0 ** -30 / 448])
    assert q[0].float().tolist() == [224.0, -448.0, 112.0, 0.0]          # exact multiples of the scale
    # in [16, 32) the e4m3 step is 2: 17 ties to 16 (even mantissa), 19 to 20; -0.001 is ~0.51 subnormal steps
    assert q[1].float().tolist() == [448.0, 16.0, 20.0, -(2.0 ** -9)]
    assert q[2].float().abs().sum() == 0
    q1, s1 = quantize_weight(w.t(), 1, FP8)                             # the same weights stored [K, N]
    assert torch.equal(q1.t().float(), q.float()) and torch.equal(s1, s)
    assert FP8.quantize(torch.tensor([500.0, -1e9, 464.0])).float().tolist() == [448.0, -448.0, 448.0]  # saturated


def test_fp8_activation_scales_come_from_the_int8_calibration():
    """Activation scale = amax / 448; calibration (and its cache) keep amax / 127, from which fp8 takes amax."""
    assert scale_from_amax(448.0, FP8) == 1.0 and scale_from_amax(12.7) == np.float32(0.1)
    int8 = QuantScales({"x": TensorScale(scale_from_amax(12.7), "calibrated (minmax)", (-3.0, 12.7))})
    fp8 = for_qtype(int8, FP8)
    assert fp8.activations["x"].scale == np.float32(float(np.float32(0.1)) * 127 / 448)  # amax in float64, one rounding
    assert fp8.activations["x"].source == "calibrated (minmax)" and fp8.activations["x"].range == (-3.0, 12.7)
    assert for_qtype(int8, INT8) is int8


def test_reference_quant_gemm_fp8_by_hand():
    """acc = exact Σ float(x_q)·float(w_q), rounded once to fp32; then the int8 epilogue; requantize to e4m3."""
    g = torch.Generator().manual_seed(0)
    x, w = _f8(g, 5, 48), _f8(g, 6, 48)
    ws, b = torch.rand(6, generator=g) * 0.01 + 1e-3, torch.randn(6, generator=g)
    attrs = FP8_ATTRS | {"x_scale": 0.02, "out_scale": None, "activation": "Relu"}
    y = run_reference("QuantGemm", [x, w, ws, b], attrs)[0]
    acc = (x.double().numpy() @ w.double().numpy().T).astype(np.float32)
    s = (np.float32(0.02) * ws.numpy()).astype(np.float32)
    want = np.maximum(acc * s + b.numpy(), 0).astype(np.float32)
    assert y.dtype == torch.float32 and np.array_equal(y.numpy(), want)
    q = run_reference("QuantGemm", [x, w, ws, b], attrs | {"out_scale": 0.05})[0]
    want_q = torch.from_numpy(want / np.float32(0.05)).clamp(-448, 448).to(F8)
    assert q.dtype == F8 and torch.equal(q.float(), want_q.float())


def test_reference_fp8_sum_is_exact_before_the_fp32_rounding():
    """448·448 + 2⁻⁹·2⁻⁹ − 448·448: an fp32 running sum loses the small product, the reference keeps it."""
    x = torch.tensor([[448.0, 2.0 ** -9, 448.0]]).to(F8)
    w = torch.tensor([[448.0, 2.0 ** -9, -448.0]]).to(F8)
    attrs = FP8_ATTRS | {"x_scale": 1.0, "out_scale": None}
    y = run_reference("QuantGemm", [x, w, torch.ones(1), None], attrs)[0]
    assert y.item() == 2.0 ** -18


def test_reference_quant_conv_fp8_with_residual():
    g = torch.Generator().manual_seed(1)
    x, w = _f8(g, 2, 4, 6, 6), _f8(g, 8, 2, 3, 3)
    ws, b, r = torch.rand(8, generator=g) * 1e-3, torch.randn(8, generator=g), torch.randn(2, 8, 3, 3, generator=g)
    attrs = FP8_ATTRS | {"group": 2, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3],
                         "pads": [1, 1, 1, 1], "strides": [2, 2], "x_scale": 0.1, "out_scale": None}
    y = run_reference("QuantConv", [x, w, ws, b, r], attrs)[0]
    acc = torch.nn.functional.conv2d(x.double(), w.double(), stride=2, padding=1, groups=2).float().numpy()
    s = (np.float32(0.1) * ws.numpy()).astype(np.float32).reshape(1, -1, 1, 1)
    assert np.array_equal(y.numpy(), acc * s + b.numpy().reshape(1, -1, 1, 1) + r.numpy())


def _mlp(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 10))
    path = export(m, (torch.randn(2, 64),), tmp_path / "mlp.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}})
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.normal(size=(64, 64)).astype(np.float32))
    return path, rng.normal(size=(256, 64)).astype(np.float32)


def _cnn(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(32, 32, 1), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(32 * 4 * 4, 10))
    path = export(m, (torch.randn(2, 3, 8, 8),), tmp_path / "cnn.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}})
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.normal(size=(64, 3, 8, 8)).astype(np.float32))
    return path, rng.normal(size=(256, 3, 8, 8)).astype(np.float32)


@pytest.mark.parametrize("model,layers,bound", [(_mlp, 3, 0.995), (_cnn, 4, 0.997)])
def test_fp8_build_matches_fp32(tmp_path, model, layers, bound):
    path, x = model(tmp_path)
    want = kiln.build(path, kiln.BuildConfig(device="cpu")).run({"x": x})["y"]
    fp8 = kiln.build(path, kiln.BuildConfig(device="cpu", fp8=True, calib=str(tmp_path / "calib.npz"),
                                            calibrator="minmax"))
    quantized = [la for la in fp8.network.layers if la.kind in ("QuantGemm", "QuantConv")]
    assert len(quantized) == layers and all(la.attrs["qtype"] == "fp8e4m3" for la in quantized)
    assert all(fp8.network.tensors[la.inputs[1]].dtype.value == "float8_e4m3fn" for la in quantized)
    assert fp8.build_info["int8"]["qtype"] == "fp8e4m3"
    assert _cosine(fp8.run({"x": x})["y"], want) >= bound


def test_fp8_keeps_an_outlier_channel_that_int8_loses(tmp_path):
    """A ×300 channel per-tensor int8 cannot represent next to the others (test_quant_budget.py's model) costs
    fp8 nothing: its steps are relative to each value."""
    from test_quant_budget import _outlier_mlp

    _, path = _outlier_mlp(tmp_path)
    x = np.load(tmp_path / "val.npz")["x"]
    want = kiln.build(path, kiln.BuildConfig(device="cpu")).run({"x": x})["y"]
    got = {q: kiln.build(path, kiln.BuildConfig(device="cpu", calib=str(tmp_path / "calib.npz"), calibrator="minmax",
                                                 **{q: True})).run({"x": x})["y"] for q in ("int8", "fp8")}
    assert _cosine(got["int8"], want) < 0.95 and _cosine(got["fp8"], want) > 0.998


def test_int8_and_fp8_together_run_fp8_and_say_so(tmp_path):
    path, _ = _mlp(tmp_path)
    e = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, fp8=True, calib=str(tmp_path / "calib.npz")))
    assert {la.attrs.get("qtype") for la in e.network.layers if la.kind == "QuantGemm"} == {"fp8e4m3"}
    assert any("--int8 --fp8" in n and "fp8" in n for n in e.build_info["notes"])


def test_fp8_from_the_int8_calibration_cache_alone(tmp_path):
    """An --int8 build writes the cache; an --fp8 build reads it without data and gets the scales a build that
    calibrates itself gets."""
    path, x = _mlp(tmp_path)
    calib, cache = str(tmp_path / "calib.npz"), str(tmp_path / "c.json")
    kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=calib, calib_cache=cache))
    cached = kiln.build(path, kiln.BuildConfig(device="cpu", fp8=True, calib_cache=cache))
    fresh = kiln.build(path, kiln.BuildConfig(device="cpu", fp8=True, calib=calib))
    assert "calibration cache" in cached.build_info["int8"]["scales_from"]
    assert cached.build_info["int8"]["tensors"].keys() == fresh.build_info["int8"]["tensors"].keys()
    assert all(cached.build_info["int8"]["tensors"][n]["scale"] == v["scale"]
               for n, v in fresh.build_info["int8"]["tensors"].items())
    assert np.array_equal(cached.run({"x": x})["y"], fresh.run({"x": x})["y"])


def test_fp8_without_ranges_is_a_config_error(tmp_path):
    path, _ = _mlp(tmp_path)
    with pytest.raises(ConfigError, match="--fp8 needs activation ranges.*--calib DATA"):
        kiln.build(path, kiln.BuildConfig(device="cpu", fp8=True))
    with pytest.raises(ConfigError, match="--fp8 needs activation ranges"):  # a cache file that does not exist
        kiln.build(path, kiln.BuildConfig(device="cpu", fp8=True, calib_cache=str(tmp_path / "none.json")))
    r = CliRunner().invoke(app, ["build", str(path), "-o", str(tmp_path / "m.plan"), "--device", "cpu", "--fp8"])
    assert r.exit_code != 0 and "--calib" in r.output and "Traceback" not in r.output


def test_fp8_device_rules():
    """cc < 8.9 names the GPU and its capability; portable plans (sm80+) cannot hold fp8; the CPU runs references."""
    config = kiln.BuildConfig(fp8=True, calib="data.npz")
    t4 = Device("cuda", "Tesla T4", "cuda:0")
    with pytest.raises(ConfigError, match=r"8\.9.*Tesla T4 has 7\.5"):
        check_fp8(config, t4, capability=(7, 5))
    with pytest.raises(ConfigError, match="A100.* 8\\.0"):
        check_fp8(config, Device("cuda", "NVIDIA A100", "cuda:0"), capability=(8, 0))
    check_fp8(config, Device("cuda", "NVIDIA L4", "cuda:0"), capability=(8, 9))
    check_fp8(config, Device("cuda", "NVIDIA H100", "cuda:0"), capability=(9, 0))
    with pytest.raises(ConfigError, match="portable"):
        check_fp8(config, Device("cuda", "NVIDIA H100", "cuda:0", "portable"), capability=(9, 0))
    check_fp8(config, Device("cpu", "x86_64", "cpu"))
    check_fp8(kiln.BuildConfig(), t4, capability=(7, 5))  # no --fp8: nothing asked


def test_fp8_refuses_a_model_with_int8_qdq(tmp_path):
    from test_quant_qdq import _quantize

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    path = export(m, (torch.randn(2, 8),), tmp_path / "m.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}})
    feeds = [{"x": np.random.default_rng(i).normal(size=(2, 8)).astype(np.float32)} for i in range(4)]
    qpath = _quantize(path, feeds, tmp_path / "q.onnx")
    np.savez(tmp_path / "calib.npz", x=np.concatenate([f["x"] for f in feeds]))
    with pytest.raises(ConfigError, match="own int8 Q/DQ.*--int8"):
        kiln.build(qpath, kiln.BuildConfig(device="cpu", fp8=True, calib=str(tmp_path / "calib.npz")))


def test_fp8_accuracy_budget(tmp_path):
    """--accuracy works with --fp8: the search quantizes to fp8 and reports all-fp8."""
    from test_quant_budget import _outlier_mlp

    _, path = _outlier_mlp(tmp_path)
    e = kiln.build(path, kiln.BuildConfig(device="cpu", fp8=True, calib=str(tmp_path / "calib.npz"),
                                          calibrator="minmax", accuracy="cosine>=0.99",
                                          validation=str(tmp_path / "val.npz")))
    budget = e.build_info["int8"]["budget"]
    assert budget["met"] and budget["fallbacks"] == [] and budget["all_int8"] > 0.99
    assert any("all-fp8 cosine" in n for n in e.build_info["notes"])


def test_fp8_plan_reports_precision_scale_source_and_fp8_weights(tmp_path):
    path, x = _cnn(tmp_path)
    fp32 = kiln.build(path, kiln.BuildConfig(device="cpu"))
    fp8 = kiln.build(path, kiln.BuildConfig(device="cpu", fp8=True, calib=str(tmp_path / "calib.npz"),
                                            calibrator="minmax"))
    s32, s8 = size_breakdown(fp32.network), size_breakdown(fp8.network)
    assert s8["fp8 weights"] > 0 and s8["int8 weights"] == 0 and s32["fp8 weights"] == 0
    assert s8["fp8 weights"] * 4 <= s32["fp32 weights"]
    fp8.save(tmp_path / "f8.plan")
    loaded = kiln.load(tmp_path / "f8.plan")
    assert np.array_equal(loaded.run({"x": x})["y"], fp8.run({"x": x})["y"])  # fp8 weights survive the plan
    rows = layer_precisions(loaded.network, loaded.build_info)
    fp8_rows = [r for r in rows.values() if r["precision"] == "fp8"]
    assert len(fp8_rows) == 4 and all(r["scale_source"] == "calibrated (minmax)" for r in fp8_rows)
    r = CliRunner().invoke(app, ["inspect", str(tmp_path / "f8.plan")], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert r.output.count("scales: calibrated (minmax)") == 4 and "weights by content: fp8 weights" in r.output
    d = json.loads(CliRunner().invoke(app, ["inspect", str(tmp_path / "f8.plan"), "--json"]).output)
    assert sum(row["precision"] == "fp8" for row in d["layers"]) == 4


def test_cli_build_fp8_summary(tmp_path):
    path, _ = _mlp(tmp_path)
    args = ["build", str(path), "-o", str(tmp_path / "m.plan"), "--device", "cpu", "--fp8", "--calib",
            str(tmp_path / "calib.npz"), "--calibrator", "minmax"]
    r = CliRunner().invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert "int8" not in s and s["fp8"]["fp8_layers"] == 3 and s["fp8"]["precision"] == "fp8"
    assert all(row["precision"] == "fp8" for row in s["fp8"]["layers"])
    assert {"scale", "min", "max"} <= set(s["fp8"]["ranges"]["x"])
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "fp8 layers" in r.output and "fp8 activation ranges" in r.output
    assert "448·scale" in r.output
