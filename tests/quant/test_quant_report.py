"""int8 reporting: the CLI build summary, per-layer precision and the engine size by content (int8 weights ≈ ¼ fp32)."""

import json

import numpy as np
import torch
from typer.testing import CliRunner

import kiln
from kiln.cli.app import app
from kiln.quant.report import layer_precisions, size_breakdown
from models.export import export


def _model(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(32 * 8 * 8, 64))
    path = export(m, (torch.randn(1, 3, 8, 8),), tmp_path / "m.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}})
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(8, 3, 8, 8)).astype(np.float32))
    return path


def test_int8_engine_holds_int8_weights_and_reports_each_layer(tmp_path):
    path = _model(tmp_path)
    fp32 = kiln.build(path, kiln.BuildConfig(device="cpu"))
    int8 = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "calib.npz"),
                                             calibrator="minmax"))
    s32, s8 = size_breakdown(fp32.network), size_breakdown(int8.network)
    assert s32["int8 weights"] == 0 and s8["int8 weights"] > 0
    assert s8["int8 weights"] * 4 <= s32["fp32 weights"]             # weights stored as int8, not dequantized
    assert sum(s8.values()) < 0.3 * sum(s32.values())                 # scales and fp32 biases are small
    fp32.save(tmp_path / "f.plan")
    int8.save(tmp_path / "i.plan")
    assert (tmp_path / "i.plan").stat().st_size < 0.35 * (tmp_path / "f.plan").stat().st_size
    loaded = kiln.load(tmp_path / "i.plan")
    per_layer = layer_precisions(loaded.network, loaded.build_info)
    int8_layers = {n: r for n, r in per_layer.items() if r["precision"] == "int8"}
    assert len(int8_layers) == 3 and all(r["scale_source"] == "calibrated (minmax)" for r in int8_layers.values())


def test_cli_build_int8_with_calibration_and_cache(tmp_path):
    path = _model(tmp_path)
    args = ["build", str(path), "-o", str(tmp_path / "m.plan"), "--device", "cpu", "--int8",
            "--calib", str(tmp_path / "calib.npz"), "--calibrator", "percentile",
            "--calib-cache", str(tmp_path / "c.json"), "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["int8"]["int8_layers"] == 3 and "calibrated (percentile)" in s["int8"]["scales_from"]
    assert {"x", "/4/Flatten_output_0"} <= set(s["int8"]["ranges"])
    assert all({"min", "max", "scale"} <= set(v) for v in s["int8"]["ranges"].values())
    # rebuild from the cache alone
    r = CliRunner().invoke(app, args[:7] + ["--calibrator", "percentile", "--calib-cache", str(tmp_path / "c.json")])
    assert r.exit_code == 0 and "calibration cache" in r.output
    # a bad calibrator name is one clear error, no traceback
    r = CliRunner().invoke(app, args[:7] + ["--calibrator", "kl"])
    assert r.exit_code != 0 and "unknown calibrator" in r.output and "Traceback" not in r.output


def test_cli_inspect_table_shows_precision_scale_source_and_size_by_content(tmp_path):
    path = _model(tmp_path)
    int8 = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "calib.npz"),
                                             calibrator="minmax"))
    int8.save(tmp_path / "i.plan")
    r = CliRunner().invoke(app, ["inspect", str(tmp_path / "i.plan")], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert r.output.count("scales: calibrated (minmax)") == 3
    sizes = size_breakdown(int8.network)
    for key in ("int8 weights", "fp32 weights", "scales", "other"):
        assert f"weights by content: {key}" in r.output
    assert sizes["int8 weights"] > 0
