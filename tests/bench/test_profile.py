"""The per-layer profile: every layer timed, percentages summing to 100, top-30 table, bench and profile CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.bench.profile import LayerProfile, LayerTime, profile_layers
from kiln.cli.profile import print_profile
from test_compare import chain_model, invoke


@pytest.fixture
def model(tmp_path):
    return chain_model(tmp_path / "chain.onnx")


def test_every_layer_is_timed(model):
    engine = kiln.build(model, kiln.BuildConfig(device="cpu", fp16=True))
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    profile = profile_layers(engine, {"x": x}, iterations=4, warmup=1)
    assert [t.name for t in profile.layers] == [l.name for l in engine.network.layers]
    assert all(len(t.times_ms) == 4 and min(t.times_ms) > 0 for t in profile.layers)
    assert sum(profile.percent(t.mean) for t in profile.layers) == pytest.approx(100.0)
    by_name = {t.name: t for t in profile.layers}
    assert by_name["mm1"].precision == "float16" and by_name["mm1"].tactic == engine.tactics["mm1"].tactic
    assert [t.mean for t in profile.ranked()] == sorted((t.mean for t in profile.layers), reverse=True)


def test_by_kind_sums_layers_of_one_kind_and_tactic():
    p = LayerProfile((LayerTime("a", "Conv", "float16", "cudnn", (1.0, 3.0)),
                      LayerTime("b", "Conv", "float16", "cudnn", (4.0,)),
                      LayerTime("c", "Conv", "float16", "triton_conv", (5.0,)),
                      LayerTime("d", "Relu", "float16", "triton_pointwise", (1.0,))), 2, "cpu")
    groups = p.by_kind()
    assert [(g["kind"], g["tactic"], g["layers"], g["ms"]) for g in groups] == [
        ("Conv", "cudnn", 2, 6.0), ("Conv", "triton_conv", 1, 5.0), ("Relu", "triton_pointwise", 1, 1.0)]
    assert sum(g["percent"] for g in groups) == pytest.approx(100.0)


def test_bench_dumps_and_exports_the_profile(model, tmp_path):
    out = tmp_path / "profile.json"
    result = invoke("bench", model, "--device", "cpu", "--iterations", "3", "--warmup", "1", "--dump-profile",
                    "--export-profile", out)
    assert result.exit_code == 0, result.output
    assert "Benchmark" in result.stdout and "Per-layer profile" in result.stdout
    exported = json.loads(out.read_text())
    assert {r["layer"] for r in exported["layers"]} == {"mm1", "scale_up", "mm2"}
    assert sum(r["percent"] for r in exported["layers"]) == pytest.approx(100.0)
    assert exported["iterations"] == 3 and exported["separate_run"]
    assert all(r["time_ms"] == pytest.approx(3 * r["mean_ms"]) for r in exported["layers"])
    assert "time ms" in result.stdout and "a separate run" in result.stdout
    as_json = json.loads(invoke("bench", model, "--device", "cpu", "--iterations", "2", "--dump-profile",
                                "--json").stdout)
    assert len(as_json["profile"]["layers"]) == 3 and "latency_ms" in as_json


def test_profile_command(model):
    result = invoke("profile", model, "--device", "cpu", "--iterations", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["iterations"] == 2


def test_table_shows_the_top_30_and_other(capsys):
    layers = tuple(LayerTime(f"layer{i}", "Relu", "float32", "reference", (float(i + 1),)) for i in range(35))
    print_profile(LayerProfile(layers, 1, "cpu"))
    out = capsys.readouterr().out
    names = {line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")}
    assert {f"layer{i}" for i in range(5, 35)} <= names and not names & {f"layer{i}" for i in range(5)}
    assert "other (5" in names  # "other (5 layers)", folded by the narrow test console
    assert f"{100 * 15 / sum(range(1, 36)):.1f}" in out  # the 5 fastest: 1+2+3+4+5 ms
