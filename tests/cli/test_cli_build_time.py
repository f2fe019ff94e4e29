"""`kiln build`'s "Build time" table and --json "build_time"; the breakdown survives a plan's save and load, and
`kiln inspect` shows it (and shows nothing for a plan from before it was recorded)."""

from __future__ import annotations

import json

import kiln
from cli.test_cli import invoke, tiny_model


def test_build_summary_shows_the_build_time_table(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    result = invoke("build", str(model), "-o", str(tmp_path / "m.plan"), "--device", "cpu", "--shapes", "x:2x4")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Build time" in out and "share" in out and "engine: memory plan" in out and "save" in out
    assert "total" in out and "100.0%" in out and "layers: 2" in out


def test_build_json_has_the_breakdown(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    result = invoke("build", str(model), "-o", str(tmp_path / "m.plan"), "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    t = json.loads(result.stdout)["build_time"]
    assert set(t) == {"phases", "counts", "check_seconds_by_tactic", "total_seconds", "unaccounted_seconds"}
    assert t["check_seconds_by_tactic"] == {}  # the CPU backend compiles and checks no candidates
    assert {"load", "import", "optimize", "precision", "engine: kernels", "save"} <= set(t["phases"])
    assert all(s >= 0 for s in t["phases"].values()) and t["unaccounted_seconds"] >= 0
    assert sum(t["phases"].values()) <= t["total_seconds"] + 1e-5
    assert t["counts"]["layers"] >= 1


def test_the_breakdown_survives_save_and_load_and_inspect_shows_it(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    engine = kiln.build(str(model), kiln.BuildConfig(device="cpu"))
    engine.save(tmp_path / "m.plan")
    loaded = kiln.load(tmp_path / "m.plan")
    assert loaded.build_info["build_phases"] == engine.build_info["build_phases"]
    assert loaded.build_info["build_counts"] == engine.build_info["build_counts"]
    result = invoke("inspect", str(tmp_path / "m.plan"))
    assert result.exit_code == 0, result.output
    assert "Build time" in result.stdout and "engine: kernels" in result.stdout
    d = json.loads(invoke("inspect", str(tmp_path / "m.plan"), "--json").stdout)
    assert d["build_time"]["phases"].keys() == engine.build_info["build_phases"].keys()


def test_a_plan_without_the_breakdown_still_loads_and_inspects(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    engine = kiln.build(str(model), kiln.BuildConfig(device="cpu"))
    for key in ("build_phases", "build_counts"):  # as plans written before they were recorded
        del engine.build_info[key]
    engine.save(tmp_path / "old.plan")
    assert "build_phases" not in kiln.load(tmp_path / "old.plan").build_info
    result = invoke("inspect", str(tmp_path / "old.plan"))
    assert result.exit_code == 0, result.output
    assert "Build time" not in result.stdout
    assert json.loads(invoke("inspect", str(tmp_path / "old.plan"), "--json").stdout)["build_time"] is None


def test_the_table_names_the_tactics_whose_checks_took_longest():
    from kiln.cli.build import build_time, build_time_table
    from rich.console import Console
    info = {"build_phases": {"tune: compile + check": 3.0}, "build_seconds": 4.0, "build_counts": {"layers": 3},
            "build_check_seconds": {"triton_conv": 2.5, "cudnn_conv": 7.25, "bad": "x", "neg": -1}}
    t = build_time(info)
    assert t["check_seconds_by_tactic"] == {"cudnn_conv": 7.25, "triton_conv": 2.5}  # untrusted values dropped
    console = Console(width=200, record=True)
    console.print(build_time_table(t))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert "thread-seconds: cudnn_conv 7.2, triton_conv 2.5" in text
