"""The benchmark suite on the CPU at tiny settings (end to end, as the lead runs it), and its FLOP counter."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a top-level folder of the repository, not an installed package

from benchmarks.roofline import count_flops  # noqa: E402

TINY = ["--models", "mobilenet_v2", "--batches", "1", "--precisions", "fp32", "--peers", "eager", "--quick",
        "--device", "cpu", "--image-size", "32"]


def _suite(tmp_path: Path, *extra: str) -> dict:
    """Run `python -m benchmarks.suite` as the lead does; return the one results JSON it wrote."""
    args = [sys.executable, "-m", "benchmarks.suite", *TINY, "--out", str(tmp_path / "out"),
            "--cache", str(tmp_path / "cache"), *extra]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (tmp_path / "out").glob("cpu-*.json")
    return json.loads(path.read_text())


def test_suite_end_to_end_on_cpu(tmp_path):
    results = _suite(tmp_path)
    (row,) = results["rows"]
    assert (row["model"], row["batch"], row["precision"]) == ("mobilenet_v2", 1, "fp32")
    kiln_ms, eager_ms = row["kiln"]["median_ms"], row["peers"]["eager"]["median_ms"]
    assert kiln_ms > 0 and eager_ms > 0 and set(row["peers"]) == {"eager"}
    assert row["best_peer"] == "eager"
    assert row["speedup_vs_best_peer"] == pytest.approx(eager_ms / kiln_ms)
    assert row["kiln"]["items_per_s"] == pytest.approx(1e3 / kiln_ms)
    assert row["kiln"]["build_seconds"] > 0
    phases = row["kiln"]["build_phases"]
    assert phases["load"] > 0 and sum(phases.values()) <= row["kiln"]["build_seconds"] * 1.01
    acc = row["kiln"]["accuracy"]["logits"]
    assert acc["cosine"] > 0.9999 and acc["max_rel_err"] < 1e-4  # fp32 on the CPU: the same torch kernels

    rate = results["runs"][0]["matmul_flops_per_s"]["fp32"]
    assert rate > 0 and row["matmul_flops_per_s"] == rate
    assert row["flops"] > 1e6 and not row["flops_uncounted"]
    assert row["floor_ms"] == pytest.approx(row["flops"] / rate * 1e3)
    assert row["kiln_fraction_of_floor"] == pytest.approx(row["floor_ms"] / kiln_ms)

    model = results["models"]["mobilenet_v2"]
    torchvision_missing = importlib.util.find_spec("torchvision") is None
    assert (model["fallback"] is not None) == torchvision_missing
    assert results["versions"]["torch"] and results["versions"]["kiln"] and results["device"]["backend"] == "cpu"

    md = next((tmp_path / "out").glob("cpu-*.md")).read_text()
    assert "| mobilenet_v2 | 1 | fp32 |" in md and f"{row['speedup_vs_best_peer']:.2f}×" in md
    assert "without max-autotune" in md and "mobilenet_v2 (b1 fp32)" in md
    top = max(phases, key=phases.get)
    assert f"- mobilenet_v2 b1 fp32 build: {top} {phases[top]:.1f} s" in md
    if torchvision_missing:
        assert "**fallback**" in md

    # a second run that has no time left skips its row, says so, and keeps the earlier measurement
    again = _suite(tmp_path, "--budget-seconds", "0")
    assert len(again["runs"]) == 2 and again["runs"][1]["budget_exhausted"]
    assert again["runs"][1]["skipped_rows"] == 1
    assert again["rows"] == results["rows"]
    assert "ran out; 1 row(s)" in next((tmp_path / "out").glob("cpu-*.md")).read_text()


def _conv_reshape_matmul_gemm() -> onnx.ModelProto:
    """x[N,3,8,8] → Conv 4×3×3×3 (pad 1) → Reshape to [N, 256]; the first N rows of a table [16, 256]; each of
    the two → MatMul 256×10, summed → Gemm 10→5.

    N reaches the Reshape and the Slice through Shape → Gather, as in exported transformers: ONNX's own shape
    inference leaves the Slice (and so its MatMul) unknown; the counter must fold it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (4, 3, 3, 3)), ("m", (256, 10)), ("g", (5, 10)), ("table", (16, 256)))]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["y"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Concat", ["n", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["y", "target"], ["flat"]),
             helper.make_node("Slice", ["table", "zero", "n", "zero"], ["rows"]),
             helper.make_node("MatMul", ["flat", "m"], ["h1"]),
             helper.make_node("MatMul", ["rows", "m"], ["h2"]),
             helper.make_node("Add", ["h1", "h2"], ["h"]),
             helper.make_node("Gemm", ["h", "g"], ["out"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_quantized_rows_time_fp16_peers(tmp_path):
    """An int8 row: kiln builds calibrated int8 layers, the peer runs fp16, accuracy is measured in the same row."""
    results = _suite(tmp_path, "--models", "minilm", "--batches", "2", "--precisions", "int8", "--peers", "eager")
    (row,) = results["rows"]
    assert row["precision"] == "int8" and row["kiln"]["median_ms"] > 0 and row["peers"]["eager"]["median_ms"] > 0
    assert row["kiln"]["accuracy"]["last_hidden_state"]["cosine"] > 0.99
    assert "int8" not in results["runs"][0]["matmul_flops_per_s"]  # no int8 matmul probe: no floor for the row
    md = next((tmp_path / "out").glob("cpu-*.md")).read_text()
    assert "| minilm | 2 | int8 |" in md


def test_flop_count_by_hand():
    count = count_flops(_conv_reshape_matmul_gemm(), {"x": (2, 3, 8, 8)})
    conv = 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)  # 2 × output elements × (Cin × kH × kW)
    matmul = 2 * (2 * 2 * 10) * 256  # two of them
    gemm = 2 * (2 * 5) * 10
    assert count.by_op == {"Conv": conv, "MatMul": matmul, "Gemm": gemm}
    assert count.flops == conv + matmul + gemm == 48328 and count.uncounted == []


def test_a_failing_peer_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    from benchmarks import suite

    real = suite.runner

    def runner(peer, model, args):
        if peer == "default":
            raise RuntimeError("compile failed\nwith detail")
        return real(peer, model, args)

    monkeypatch.setattr(suite, "runner", runner)
    args = [a for a in TINY if a != "eager"]  # --peers eager → --peers eager,default
    args.insert(args.index("--peers") + 1, "eager,default")
    results = suite.main([*args, "--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    (row,) = results["rows"]
    assert row["peers"]["default"] == {"error": "RuntimeError: compile failed"}
    assert row["best_peer"] == "eager" and row["speedup_vs_best_peer"] > 0 and row["kiln"]["median_ms"] > 0
    md = next(tmp_path.glob("cpu-*.md")).read_text()
    assert "error [1]" in md and "1. RuntimeError: compile failed" in md


def test_few_sms_probe_gives_each_run_its_own_timing_cache():
    """A green context reports every SM, so the slice's and the whole GPU's runs must not share tuned choices."""
    from pathlib import Path

    from benchmarks.probes.gpu_few_sms import own_cache

    assert own_cache(["--models", "x"], Path("/o/sms-40/cache"), "sms-40") == ["--models", "x", "--cache",
                                                                                 "/o/sms-40/cache"]
    given = own_cache(["--cache", "/tmp/c", "--quick"], Path("/o/sms-all/cache"), "sms-all")
    assert given == ["--cache", "/tmp/c/sms-all", "--quick"]


def test_peer_runs_keep_the_fastest_and_record_every_median(tmp_path, monkeypatch):
    """--peer-runs 3: the peer is prepared and timed three times; its row keeps the fastest run."""
    from benchmarks import suite

    medians = iter([1.0, 5.0, 3.0, 4.0])  # kiln's run, then the peer's three
    monkeypatch.setattr(suite, "timed", lambda fn, device, batch, quick: {"median_ms": next(medians, 9.0)})
    results = suite.main([*TINY, "--peer-runs", "3", "--out", str(tmp_path), "--cache", str(tmp_path / "cache")])
    (row,) = results["rows"]
    eager = row["peers"]["eager"]
    assert eager["run_medians_ms"] == [5.0, 3.0, 4.0] and eager["median_ms"] == 3.0
    assert row["speedup_vs_best_peer"] == 3.0


def test_rejected_candidates_counts_by_tactic_and_reason():
    """Refusals up front, failed checks and timing losses alike, by tactic (a candidate's config stripped) and
    reason; the winner's other configs are not losses."""
    from benchmarks import suite
    from kiln.tactics.choice import Choice

    class Engine:
        tactics = {"a": Choice("cudnn_fused_conv", rejected=[("triton_conv{'BLOCK_M': 64}", "failed: RuntimeError: x"),
                                                             ("triton_depthwise_conv", "only depthwise convolutions")]),
                   "b": Choice("cudnn_fused_conv", rejected=[("triton_conv{'BLOCK_M': 32}", "failed: RuntimeError: x"),
                                                             ("triton_depthwise_conv", "only depthwise convolutions")]),
                   "c": Choice("triton_conv", timed=[("triton_conv{'BLOCK_M': 64}", 3.0), ("triton_conv{}", 4.0),
                                                     ("cudnn_fused_conv{'layout': 'nhwc'}", 5.0)])}

    assert suite.rejected_candidates(Engine()) == {
        "triton_conv": {"failed: RuntimeError: x": 2}, "triton_depthwise_conv": {"only depthwise convolutions": 2},
        "cudnn_fused_conv": {"timed slower than the winner": 1}}
