"""`python -m benchmarks.dynamic` without a GPU: shapes and profiles, the row ratios, the results files, and the run's
resume and budget logic (the measuring itself stubbed); one GPU test runs it for real."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a top-level folder of the repository, not an installed package

from benchmarks import dynamic  # noqa: E402
from benchmarks.models import SPECS, instantiate, onnx_file  # noqa: E402


def test_shapes_parse_and_fit_their_models():
    assert dynamic.parse_shapes("1x16, 4x64,8") == [(1, 16), (4, 64), (8,)]
    for bad in ("1x2x3", "ax16", "0x16", "", "4x"):
        with pytest.raises(argparse.ArgumentTypeError):
            dynamic.parse_shapes(bad)
    minilm, resnet = SPECS["minilm"], SPECS["resnet50"]
    assert dynamic.shapes_for(minilm, None) == [(1, 16), (4, 64), (8, 128), (16, 256), (32, 512)]
    assert dynamic.shapes_for(resnet, None) == [(1,), (8,), (32,), (64,)]
    assert dynamic.shapes_for(minilm, [(2, 32), (8,)]) == [(2, 32)]  # each model takes the shapes of its rank
    assert dynamic.shapes_for(resnet, [(2, 32), (8,)]) == [(8,)]
    with pytest.raises(ValueError, match="outside its profile 1x16..32x512"):
        dynamic.shapes_for(minilm, [(4, 8)])
    with pytest.raises(SystemExit):
        dynamic.parse_args(["--models", "bert", "--shapes", "64x128"])
    with pytest.raises(SystemExit):
        dynamic.parse_args(["--models", "vit_b_16"])
    with pytest.raises(SystemExit):  # no shape of the text models' rank
        dynamic.parse_args(["--models", "bert", "--shapes", "8"])
    args = dynamic.parse_args(["--models", "minilm,resnet50", "--shapes", "1x16,8", "--repeats", "7"])
    assert args.sweep == {"minilm": [(1, 16)], "resnet50": [(8,)]} and args.repeats == 7 and not args.skip_peers


def test_profiles():
    ids = ((1, 16), (8, 128), (32, 512))
    assert dynamic.profile(SPECS["bert"]) == {"input_ids": ids, "attention_mask": ids, "token_type_ids": ids}
    assert dynamic.profile(SPECS["resnet50"]) == {"input": ((1, 3, 224, 224), (32, 3, 224, 224), (64, 3, 224, 224))}


def test_text_export_has_dynamic_batch_and_sequence(tmp_path):
    spec = SPECS["minilm"]
    made = instantiate(spec, 32)
    path, cached = onnx_file(spec, made, 32, tmp_path, dynamic_seq=True)
    assert not cached and "-dynseq-" in path.name
    graph = onnx.load(str(path), load_external_data=False).graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*graph.input, *graph.output]}
    assert dims["input_ids"] == dims["attention_mask"] == dims["token_type_ids"] == ["batch", "seq"]
    assert dims["last_hidden_state"] == ["batch", "seq", 384] and dims["pooler_output"] == ["batch", 384]
    assert onnx_file(spec, made, 32, tmp_path, dynamic_seq=True) == (path, True)
    assert onnx_file(spec, made, 32, tmp_path)[0] != path  # the batch-only export keeps its own file


def _row(model="minilm", shape="1x16", dyn=2.0, static=1.0, peers=None) -> dict:
    return dynamic.ratios({"model": model, "shape": shape, "batch": int(shape.split("x")[0]),
                           "kiln_dynamic": {"first_call_ms": 30.0, "median_ms": dyn},
                           "kiln_static": {"build_seconds": 12.0, "median_ms": static}, "max_abs_diff": 1e-3,
                           "peers": peers if peers is not None else {"eager": {"first_call_ms": 9.0, "median_ms": 4.0},
                                                                     "compile_dynamic": {"error": "Boom: no"},
                                                                     "reduce_overhead": {"first_call_ms": 9e3,
                                                                                         "median_ms": 3.0}}})


def test_ratios():
    row = _row()
    assert row["dynamic_over_static"] == 2.0
    assert row["best_peer"] == "reduce_overhead" and row["speedup_vs_best_peer"] == 1.5
    bare = _row(static=None, peers={})
    assert "dynamic_over_static" not in bare and "speedup_vs_best_peer" not in bare and "best_peer" not in bare
    no_dyn = dynamic.ratios({"kiln_dynamic": {"error": "x"}, "kiln_static": {"median_ms": 1.0},
                             "peers": {"eager": {"median_ms": 2.0}}})
    assert no_dyn["best_peer"] == "eager" and "speedup_vs_best_peer" not in no_dyn


def _results(started: str, rows: list[dict], models: dict | None = None) -> dict:
    return {"device": {"backend": "cuda", "name": "NVIDIA H100", "slug": "nvidia-h100"}, "date": "2026-11-25",
            "versions": {"kiln": "0.1.0", "torch": "2.11", "triton": "3.6", "cuda": "13.0"},
            "runs": [{"started": started, "settings": {"timing": "call, synchronize; median of 100"}}],
            "models": models or {}, "rows": rows}


def test_results_files_merge_by_model_and_shape(tmp_path):
    models = {"minilm": {"source": "transformers", "dynamic_build_seconds": 40.0,
                         "profile": {"input_ids": ["1x16", "8x128", "32x512"]}}}
    json_path, md_path = dynamic.write(_results("t1", [_row(shape="4x64"), _row(shape="1x16")], models), tmp_path)
    assert json_path.name == "dynamic-nvidia-h100-2026-11-25.json" and md_path.suffix == ".md"
    # a later run re-measures 1x16 and adds resnet50 b8: rows keyed by model and shape, the later wins
    later = _results("t2", [_row(shape="1x16", dyn=1.1), _row(model="resnet50", shape="8", dyn=5.0, static=5.0)])
    dynamic.write(later, tmp_path)
    got = json.loads(json_path.read_text())
    assert [(r["model"], r["shape"]) for r in got["rows"]] == [("minilm", "1x16"), ("minilm", "4x64"),
                                                                ("resnet50", "8")]
    assert got["rows"][0]["kiln_dynamic"]["median_ms"] == 1.1 and got["rows"][0]["dynamic_over_static"] == 1.1
    assert [r["started"] for r in got["runs"]] == ["t1", "t2"] and got["models"] == models
    assert not list(tmp_path.glob(".*.tmp"))
    md = md_path.read_text()
    assert "| minilm | 1x16 | 1.100 (first 30) | 1.000 (12 s) | 1.10× | 4.000 | error [1] | 3.000 (first 9000) " \
           "| 2.73× (reduce_overhead) | 0.001 |" in md
    assert "1. Boom: no" in md and "input_ids 1x16/8x128/32x512" in md
    assert "dynamic ÷ static ≤ 1.15×: NOT met, worst 2.00× (minilm 4x64)" in md
    assert "best torch ÷ kiln dynamic ≥ 1.3×: NOT met, worst 0.60× (resnet50 8)" in md
    assert "first call at a shape ≤ 50 ms: met, worst 30.0 ms" in md


def test_run_writes_each_row_resumes_and_stops_on_budget(tmp_path, monkeypatch):
    """The run's bookkeeping with the measuring stubbed: a row written per shape, --resume skips measured shapes,
    a failed setup becomes error rows, and the budget stops before a shape."""
    written = []

    def setup_model(spec, args, budget, info):
        if spec.name == "bert":
            raise RuntimeError("build failed\ndetail")
        info["dynamic_build_seconds"] = 1.0
        return {"ctx": None}

    def bench_shape(spec, shape, model, args, budget):
        if written:  # the previous shape's row is already on disk
            assert len(json.loads(next(tmp_path.glob("dynamic-*.json")).read_text())["rows"]) >= len(written)
        written.append((spec.name, dynamic.label(shape)))
        return _row(spec.name, dynamic.label(shape))

    monkeypatch.setattr(dynamic, "setup_model", setup_model)
    monkeypatch.setattr(dynamic, "bench_shape", bench_shape)
    base = ["--device", "cpu", "--out", str(tmp_path), "--cache", str(tmp_path / "cache")]
    dynamic.main([*base, "--models", "minilm", "--shapes", "1x16,4x64"])
    assert written == [("minilm", "1x16"), ("minilm", "4x64")]
    results = dynamic.main([*base, "--models", "minilm,bert,resnet50", "--shapes", "1x16,8x128,8", "--resume"])
    assert written[2:] == [("minilm", "8x128"), ("resnet50", "8")]
    rows = {(r["model"], r["shape"]): r for r in json.loads(next(tmp_path.glob("dynamic-*.json")).read_text())["rows"]}
    assert len(rows) == 6 and rows[("bert", "1x16")]["error"] == "setup failed: RuntimeError: build failed"
    assert results["models"]["minilm"]["dynamic_build_seconds"] == 1.0
    dynamic.main([*base, "--models", "resnet50", "--shapes", "1,32", "--budget-seconds", "0"])
    assert len(written) == 4  # nothing measured with no time left


def test_sweep_end_to_end_on_cpu(tmp_path, monkeypatch):
    """Real kiln engines (one dynamic, one per shape) on the CPU, and the eager peer (torch.compile stubbed to eager:
    compiling on the CPU takes minutes)."""
    monkeypatch.setattr(dynamic.torch, "compile", lambda module, **kw: module)
    results = dynamic.main(["--models", "minilm", "--shapes", "1x16,2x32", "--repeats", "2", "--device", "cpu",
                            "--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    assert [r["shape"] for r in results["rows"]] == ["1x16", "2x32"]
    for row in results["rows"]:
        assert row["kiln_dynamic"]["first_call_ms"] > 0 and row["kiln_static"]["build_seconds"] > 0
        assert row["dynamic_vs_static"]["last_hidden_state"]["cosine"] > 0.999 and row["max_abs_diff"] < 0.05
        assert set(row["peers"]) == set(dynamic.PEERS) and all("median_ms" in m for m in row["peers"].values())
        assert row["dynamic_over_static"] == row["kiln_dynamic"]["median_ms"] / row["kiln_static"]["median_ms"]
        assert row["speedup_vs_best_peer"] > 0
    assert results["models"]["minilm"]["profile"]["input_ids"] == ["1x16", "8x128", "32x512"]
    md = next(tmp_path.glob("dynamic-cpu-*.md")).read_text()
    assert "input_ids, attention_mask, token_type_ids 1x16/8x128/32x512" in md and "| minilm | 2x32 |" in md


@pytest.mark.gpu
def test_dynamic_sweep_on_gpu(tmp_path):
    results = dynamic.main(["--models", "minilm", "--shapes", "1x16,2x48", "--repeats", "5", "--out", str(tmp_path),
                            "--cache", str(tmp_path / "cache")])
    assert [r["shape"] for r in results["rows"]] == ["1x16", "2x48"]
    for row in results["rows"]:
        assert row["kiln_dynamic"]["median_ms"] > 0 and row["kiln_static"]["build_seconds"] > 0
        assert set(row["peers"]) == set(dynamic.PEERS) and all("median_ms" in m for m in row["peers"].values())
        assert row["dynamic_over_static"] > 0 and row["speedup_vs_best_peer"] > 0
        assert row["dynamic_vs_static"]["last_hidden_state"]["cosine"] > 0.999


def test_first_call_costs_count_garbage_collections_in_the_first_call():
    """A collection inside the first call is timed and counted beside it; none is left pending from before."""
    import gc

    calls = []

    def fn():
        calls.append(1)
        if len(calls) == 1:
            gc.collect()
        return {}

    m = dynamic.first_calls(fn)
    assert m["first_call_costs"]["gc_runs"] >= 1 and m["first_call_costs"]["gc_ms"] > 0
    quiet = dynamic.first_calls(lambda: {})["first_call_costs"]
    assert quiet["gc_runs"] == 0 and quiet["gc_ms"] == 0
    assert "gc" in dynamic._brief(m)


def test_timed_calls_interleave_in_rotating_rounds_and_a_failure_stays_its_own():
    """Every contender runs its share in each round, the first of a round rotating; one that fails mid-way is an
    error and the others still get all their calls."""
    order = []

    def contender(name, fail_at=None):
        def fn():
            order.append(name)
            if fail_at is not None and order.count(name) == fail_at:
                raise RuntimeError("boom")
        return fn

    out = dynamic.interleaved({"a": contender("a"), "b": contender("b"), "c": contender("c", fail_at=15)}, repeats=10,
                              rounds=5)
    timed = order[3 * dynamic.WARMUP:]
    assert timed[:6] == ["a", "a", "b", "b", "c", "c"] and timed[6:12] == ["b", "b", "c", "c", "a", "a"]
    assert order.count("a") == order.count("b") == dynamic.WARMUP + 10
    assert set(out["a"]) == {"median_ms", "round_medians_ms"} and len(out["a"]["round_medians_ms"]) == 5
    assert "boom" in out["c"]["error"]
