"""kiln bench reports the first call at the benchmarked shapes (shape-program recording, CUDA graph capture on a
GPU) apart from the steady-state latency, in the table and in --json (issue 23)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import kiln
from kiln.bench.phases import IterationTimes
from kiln.bench.result import BenchResult
from kiln.bench.session import BenchOptions, run_bench
from test_cli import invoke, tiny_model

SLOW_MS = 60.0


@pytest.fixture
def dynamic(tmp_path):
    return tiny_model(tmp_path / "tiny.onnx")  # x: [batch, 4]


def _slow_first_call(engine) -> kiln.Engine:
    """The engine with one-time work on its first call (as a GPU's graph capture or a shape recording)."""
    kernel, calls = engine.kernels[0], []

    def once(args, **kw):
        if not calls:
            time.sleep(SLOW_MS / 1e3)
        calls.append(1)
        return kernel(args, **kw)

    engine.kernels[0] = once
    return engine


def _engine(dynamic):
    return _slow_first_call(kiln.build(dynamic, kiln.BuildConfig(device="cpu")))


def test_first_call_is_apart_from_the_timed_queries(dynamic):
    x = np.ones((3, 4), np.float32)
    r = run_bench(_engine(dynamic), {"x": x}, BenchOptions(iterations=5, warmup=2), batch=3)
    assert r.count == 5 and r.first_call_ms >= SLOW_MS and 0 < r.second_call_ms < SLOW_MS
    assert max(t.host_ms for t in r.iterations) < SLOW_MS  # the one-time work is not in the steady state
    j = r.to_json()
    assert j["first_call_ms"] == r.first_call_ms and j["latency_ms"]["median"] < SLOW_MS
    assert j["first_call_per_stream_ms"] == []
    assert "x the median" in r.first_call_text() and "--warmup 0" not in r.first_call_text()


def test_without_warmup_the_first_timed_query_is_the_first_call(dynamic):
    r = run_bench(_engine(dynamic), {"x": np.ones((2, 4), np.float32)}, BenchOptions(iterations=4, warmup=0))
    assert r.first_call_ms == r.iterations[0].host_ms >= SLOW_MS
    assert r.second_call_ms == r.iterations[1].host_ms < SLOW_MS
    assert "also among the timed queries (--warmup 0)" in r.first_call_text()


def test_each_stream_has_its_first_call(dynamic):
    engine = kiln.build(dynamic, kiln.BuildConfig(device="cpu"))
    r = run_bench(engine, {"x": np.ones((2, 4), np.float32)}, BenchOptions(iterations=3, warmup=1, streams=2))
    assert len(r.first_calls_ms) == 2 and all(t > 0 for t in r.first_calls_ms)
    assert r.to_json()["first_call_per_stream_ms"] == r.first_calls_ms and r.first_call_ms == r.first_calls_ms[0]


def test_first_call_text_names_the_one_time_work():
    its = [IterationTimes(0, float(i), 1.0, 0.9) for i in range(4)]
    gpu = BenchResult(its, 0.01, 1, "cuda:0", 10, cuda_graph=True, first_calls_ms=[25.0], shape_program=True,
                      second_call_ms=12.5)
    assert gpu.first_call_text() == ("25.000 ms (first query at these shapes, 25.0x the median; with any one-time "
                                     "work at them: shape-program recording and CUDA graph capture (a dynamic engine "
                                     "captures a shape at its second call)); second call 12.500 ms")
    assert gpu.to_json()["second_call_ms"] == 12.5
    static = BenchResult(its, 0.01, 1, "cuda:0", 10, cuda_graph=True, first_calls_ms=[25.0], second_call_ms=1.0)
    assert static.first_call_text().endswith("work at them: CUDA graph capture)")  # captured at once: no 2nd call
    assert BenchResult(its, 0.01, 1, "cpu", 1).first_call_text() is None
    assert BenchResult(its, 0.01, 1, "cpu", 1).to_json()["first_call_ms"] is None


def test_cli_reports_the_first_call_in_json_and_table(dynamic):
    result = invoke("bench", str(dynamic), "--device", "cpu", "--batch", "3", "--iterations", "4", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["shapes"] == {"x": [3, 4]} and d["first_call_ms"] > 0 and "median" in d["latency_ms"]
    text = invoke("bench", str(dynamic), "--device", "cpu", "--batch", "3", "--iterations", "4")
    assert text.exit_code == 0, text.output
    assert "first call" in text.stdout and "first query at these shapes" in text.stdout
