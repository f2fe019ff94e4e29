"""`kiln debug precision`: on a model whose one middle layer overflows in fp16 (x * 2**17 * 2**-17, exact in
fp32), both search modes must name that layer alone, building the fp32 reference only once."""

from __future__ import annotations

import json

import pytest

import kiln
from test_compare import assert_one_error_line, chain_model, invoke


@pytest.fixture
def model(tmp_path):
    return chain_model(tmp_path / "chain.onnx")


@pytest.mark.parametrize("mode", ["bisect", "linear"])
def test_finds_the_overflowing_layer(model, mode, monkeypatch):
    builds = []
    real = kiln.build
    monkeypatch.setattr(kiln, "build", lambda *a, **k: builds.append(a[1]) or real(*a, **k))
    result = invoke("debug", "precision", model, "--precision", "fp16", "--mode", mode, "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["fp32_layers"] == ["scale_up"] and report["flags"] == ["--layer-precision scale_up=fp32"]
    assert report["outputs"]["y"]["passed"] and report["candidates"] == 3
    assert [c.fp16 for c in builds].count(False) == 1  # the fp32 reference: built and run once
    assert len(builds) == 1 + len(report["builds"]) and report["builds"][-1]["passed"]


def test_cosine_criterion_and_the_printed_flags(model):
    result = invoke("debug", "precision", model, "--cosine", "0.9999", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "scale_up" in result.stdout and "--fp16 --layer-precision scale_up=fp32" in result.stdout


def test_nothing_to_pin_when_fp16_passes(tmp_path):
    model = chain_model(tmp_path / "tame.onnx", up=2.0)
    result = invoke("debug", "precision", model, "--device", "cpu", "--mode", "linear")
    assert result.exit_code == 0 and "nothing to pin" in result.stdout


def test_error_paths(model, tmp_path):
    assert_one_error_line(invoke("debug", "precision", tmp_path / "missing.onnx"), "does not exist")
    assert_one_error_line(invoke("debug", "precision", model, "--mode", "random"), "--mode")
    assert_one_error_line(invoke("debug", "precision", model, "--precision", "int4"), "--precision")
    assert_one_error_line(invoke("debug", "precision", model, "--precision", "int8"), "--calib")
    assert_one_error_line(invoke("debug", "precision", model, "--cosine", "0.99", "--rtol", "1"), "--cosine")
