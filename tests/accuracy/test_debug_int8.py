"""`kiln debug precision --precision int8`: on a small CNN whose second conv reads a huge outlier channel, every
quantizable layer gets an error, that conv ranks worst, calibration runs once, and the suggested flags pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import kiln
from kiln.accuracy.metrics import Tolerance, compare_arrays
from test_compare import assert_one_error_line, invoke
from models.export import export

OUTLIER = 2000.0


class SmallCNN(nn.Module):
    """conv1 → relu → conv2 → relu → conv3 → relu → global pool → fc; conv1's channel 0 is OUTLIER times larger,
    and conv2 divides it back, so the float function is tame but conv2's int8 input scale is set by one channel."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.conv3, self.fc = nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.Linear(16, 10)
        with torch.no_grad():
            for m in (self.conv1, self.conv2, self.conv3, self.fc):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.weight[0].numel() ** 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            self.conv1.weight[0] *= OUTLIER
            self.conv1.bias[0] *= OUTLIER
            self.conv2.weight[:, 0] /= OUTLIER

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        x = torch.relu(self.conv3(x)).mean((2, 3))
        return self.fc(x)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """(model.onnx, calib.npy) in a module-wide folder."""
    d = tmp_path_factory.mktemp("cnn")
    path = export(SmallCNN(), (torch.randn(2, 3, 12, 12),), d / "cnn.onnx", dynamo=False, input_names=["input"],
                  output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    np.save(d / "calib.npy", np.random.default_rng(0).standard_normal((32, 3, 12, 12)).astype(np.float32))
    return path, d / "calib.npy"


def run_int8(cnn, *more):
    model, calib = cnn
    result = invoke("debug", "precision", model, "--precision", "int8", "--calib", calib, "--device", "cpu", *more)
    assert result.exit_code == 0, result.output
    return result


def test_every_layer_ranked_worst_first_and_flags_pass(cnn, monkeypatch):
    builds = []
    real = kiln.build
    monkeypatch.setattr(kiln, "build", lambda *a, **k: builds.append(a[1]) or real(*a, **k))
    report = json.loads(run_int8(cnn, "--cosine", "0.9999", "--json").stdout)
    names = [e["name"] for e in report["layers"]]
    assert len(names) == report["candidates"] == 4 and all("Conv" in n or "Gemm" in n for n in names)
    assert "conv2" in names[0] and report["layers"][0]["cosine"] < min(e["cosine"] for e in report["layers"][1:])
    assert all(0 < e["cosine"] <= 1 and e["max_rel"] >= 0 and e["top1"] is not None for e in report["layers"])
    assert report["calibrations"] == 1 and report["samples"] == 32  # calibrated once; every build read the cache
    assert [c.int8 for c in builds].count(False) == 1 and len(builds) == 1 + report["builds"]  # one per set
    assert not report["all_int8"]["passed"] and "conv2" in " ".join(report["fp32_layers"])
    assert report["outputs"]["logits"]["passed"]
    assert report["flags"] == [f"--layer-precision {n}=fp32" for n in report["fp32_layers"]]

    # the suggested flags, passed to a build, meet the tolerance on the same data
    model, calib = cnn
    x = np.load(calib)
    pins = {f.split()[1].rpartition("=")[0]: "fp32" for f in report["flags"]}
    fp32 = real(model, kiln.BuildConfig(device="cpu")).create_context().run({"input": x})["logits"]
    int8 = real(model, kiln.BuildConfig(device="cpu", int8=True, calib=str(calib), layer_precisions=pins))
    assert all(r["precision"] == "float" for n, r in int8.build_info["int8"]["layers"].items() if n in pins)
    got = int8.create_context().run({"input": x})["logits"]
    assert compare_arrays(fp32, got, Tolerance(0, 0, 0.9999)).passed


def test_table_linear_mode_and_calibrators(cnn):
    out = run_int8(cnn, "--cosine", "0.9999", "--mode", "linear", "--calibrator", "minmax").stdout
    assert "int8 error per layer" in out and "conv2" in out and "(all int8)" in out
    assert "build with:" in out and "--int8 --calib" in out and "--calibrator minmax" in out
    assert "--layer-precision" in out and "conv2" in out.split("build with:")[1]
    loose = run_int8(cnn, "--cosine", "0.5", "--calibrator", "percentile").stdout
    assert "nothing to keep float" in loose


def test_smooth_alpha_and_given_inputs(cnn, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(3).standard_normal((4, 3, 12, 12)).astype(np.float32))
    report = json.loads(run_int8(cnn, "--smooth-alpha", "0.5", "--input", f"input={x}", "--json").stdout)
    assert report["samples"] == 4 and len(report["layers"]) == 4 and "SmoothQuant" in report["scales_from"]


def test_int8_error_paths(cnn, tmp_path):
    model, calib = cnn
    assert_one_error_line(invoke("debug", "precision", model, "--precision", "int8"), "--calib")
    assert_one_error_line(invoke("debug", "precision", model, "--precision", "int8", "--calib",
                                 tmp_path / "none.npz"), "does not exist")
    assert_one_error_line(invoke("debug", "precision", model, "--precision", "int8", "--calib", calib,
                                 "--calibrator", "guess", "--device", "cpu"), "calibrator")
    assert_one_error_line(invoke("debug", "precision", model, "--calib", calib), "--precision int8")
    assert_one_error_line(invoke("debug", "precision", model, "--precision", "int4"), "--precision")
