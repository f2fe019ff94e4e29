"""The demo models: made on first use into the cache folder, built, checked against torch, timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import kiln
from kiln.cli.app import app
from kiln.demo import DEMOS, cache_dir, runner


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "k"))
    assert cache_dir() == tmp_path / "k" / "demo"
    monkeypatch.delenv("KILN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "kiln" / "demo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "kiln" / "demo"


@pytest.mark.slow  # exports and builds both demo models: needs Conv, Gemm, MatMul, LayerNormalization, ...
def test_demo_builds_checks_and_times_every_model(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runner, "BENCH_SECONDS", 0.2)
    result = CliRunner().invoke(app, ["demo", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["model"] for r in rows] == [d.name for d in DEMOS]
    for r in rows:
        assert r["max_abs_diff_vs_torch"] < 1e-3 and r["bench"]["iterations"] >= 1
        engine = kiln.load(r["plan"])
        assert [t.name for t in engine.inputs] == [d.input_name for d in DEMOS if d.name == r["model"]]

    def no_export(*args, **kwargs):
        raise AssertionError("the cached demo models must be reused")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    for demo in DEMOS:  # a second use reuses the cache
        assert all(p.is_file() for p in runner.export(demo, tmp_path / "demo"))
