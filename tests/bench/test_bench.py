"""The latency-measuring core: stopping rules, statistics, throughput, argument checks."""

import time

import pytest
import torch

from kiln.bench import LatencyStats, measure
from kiln.errors import ConfigError


def test_statistics_of_known_latencies():
    stats = LatencyStats(tuple(float(x) for x in range(1, 101)), batch=4)
    assert (stats.min, stats.max, stats.count) == (1.0, 100.0, 100)
    assert stats.mean == pytest.approx(50.5)
    assert stats.median == pytest.approx(50.5)
    assert stats.p90 == pytest.approx(90.1)  # numpy's linear interpolation between ranks
    assert stats.p99 == pytest.approx(99.01)
    assert stats.queries_per_s == pytest.approx(1000 / 50.5)
    assert stats.items_per_s == pytest.approx(4 * 1000 / 50.5)
    j = stats.to_json()
    assert j["latency_ms"]["p90"] == pytest.approx(90.1) and j["iterations"] == 100 and j["batch"] == 4


def test_iterations_and_warmup_are_counted_exactly():
    calls = []
    stats = measure(lambda: calls.append(1), warmup=3, iterations=7)
    assert len(calls) == 10 and stats.count == 7 and stats.warmup == 3
    assert stats.min <= stats.median <= stats.p90 <= stats.p99 <= stats.max


def test_duration_stops_the_run():
    start = time.perf_counter()
    stats = measure(lambda: time.sleep(0.01), warmup=0, duration=0.1)
    elapsed = time.perf_counter() - start
    assert 3 <= stats.count <= 11 and elapsed < 1.0
    assert stats.min >= 9.0  # each call sleeps 10 ms; perf_counter must see at least that


def test_the_first_limit_reached_ends_the_run():
    stats = measure(lambda: None, warmup=0, iterations=5, duration=60)
    assert stats.count == 5


@pytest.mark.parametrize("kw", [{"iterations": 0}, {"duration": 0}, {"duration": -1.0}, {"warmup": -1}])
def test_bad_arguments_are_config_errors(kw):
    with pytest.raises(ConfigError):
        measure(lambda: None, **kw)


@pytest.mark.gpu
def test_cuda_events_time_device_work():
    a = torch.randn(1024, 1024, device="cuda")
    stats = measure(lambda: a @ a, device="cuda", warmup=2, iterations=10)
    assert stats.count == 10 and stats.min > 0 and stats.device == "cuda"


# -- statistics and warnings ------------------------------------------------------------------------------------
from kiln.bench.clocks import throttle_warning  # noqa: E402
from kiln.bench.phases import IterationTimes  # noqa: E402
from kiln.bench.result import BenchResult  # noqa: E402
from kiln.bench.stats import parse_percentiles, spread, summarize  # noqa: E402


def test_summary_has_the_chosen_percentiles():
    s = summarize([float(x) for x in range(1, 101)], (50, 99.9))
    assert list(s) == ["min", "mean", "median", "p50", "p99.9", "max"]
    assert s["p99.9"] == pytest.approx(99.901) and s["p50"] == s["median"] == pytest.approx(50.5)
    assert parse_percentiles("90, 99.5") == (90.0, 99.5) and parse_percentiles(None) == (90.0, 99.0)
    for bad in ("", "abc", "101", "-1,50"):
        with pytest.raises(ConfigError):
            parse_percentiles(bad)


def test_spread_sees_a_shift_within_the_run():
    steady = [1.0, 1.01, 0.99, 1.0] * 10
    assert spread(steady) < 0.025
    slowed = [1.0] * 30 + [1.1] * 10  # the last quarter 10 % slower: a clock drop mid-run
    assert spread(slowed) == pytest.approx(0.1)
    assert spread([1.0, 2.0]) is None


def _cuda_result(enqueue=0.1, h2d=0.2, compute=1.0, d2h=0.1, drift=0.0, n=40, clocks=None) -> BenchResult:
    its = [IterationTimes(0, i * 2.0, 1.5, compute * (1 + (drift if i >= 3 * n // 4 else 0)), enqueue, h2d, d2h,
                          h2d + compute + d2h) for i in range(n)]
    return BenchResult(its, n * 2e-3, batch=8, device="cuda", warmup=0, cuda_graph=True, clocks=clocks)


def test_a_balanced_gpu_run_has_no_warnings():
    r = _cuda_result()
    assert r.warnings() == []
    j = r.to_json()
    assert j["throughput"]["queries_per_s"] == pytest.approx(40 / 0.08) and j["throughput"]["items_per_s"] == \
        pytest.approx(8 * 40 / 0.08)
    assert j["phases_ms"]["compute"]["median"] == pytest.approx(1.0) and j["total_gpu_s"] == pytest.approx(0.052)
    assert set(j["phases_ms"]) == {"host", "enqueue", "h2d", "compute", "d2h", "gpu"}


@pytest.mark.parametrize("kw, words", [({"enqueue": 2.0}, "bound by enqueue"),
                                       ({"h2d": 0.8, "d2h": 0.5}, "bound by data transfers"),
                                       ({"drift": 0.05}, "varies by 5.0 %")])
def test_warnings_name_what_bounds_the_run(kw, words):
    warnings = _cuda_result(**kw).warnings()
    assert len(warnings) == 1 and words in warnings[0], warnings


def test_throttled_clocks_warn_only_with_a_slowdown_reason():
    hot = {"sm_mhz": 1200, "max_sm_mhz": 1980, "slowdowns": ["software thermal slowdown"]}
    assert "throttled" in throttle_warning(hot) and "throttled" in _cuda_result(clocks=hot).warnings()[0]
    assert throttle_warning({"sm_mhz": 1200, "max_sm_mhz": 1980, "slowdowns": []}) is None
    assert throttle_warning({"sm_mhz": 1970, "max_sm_mhz": 1980, "slowdowns": ["software power cap"]}) is None
    assert throttle_warning(None) is None


# -- kiln bench on the CPU ----------------------------------------------------------------------------------------
import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from kiln.bench.session import BenchOptions, run_bench  # noqa: E402
from test_cli import assert_one_error_line, tiny_model  # noqa: E402
from test_compare import chain_model, invoke  # noqa: E402


@pytest.fixture
def dynamic(tmp_path):
    return tiny_model(tmp_path / "tiny.onnx")  # x: [batch, 4]


@pytest.fixture
def fixed(tmp_path):
    return chain_model(tmp_path / "chain.onnx")  # x: [4, 8]


def test_cpu_run_measures_compute_and_says_so(fixed):
    engine = kiln.build(fixed, kiln.BuildConfig(device="cpu"))
    x = np.ones((4, 8), np.float32)
    r = run_bench(engine, {"x": x}, BenchOptions(iterations=6, warmup=1), batch=4)
    assert r.count == 6 and all(0 < t.compute_ms <= t.host_ms for t in r.iterations)
    assert r.phases()["h2d"] is None and r.phases()["gpu"] is None and r.total_gpu_s() is None
    assert "CPU backend" in r.notes()[0] and r.warnings() == []


def test_streams_run_concurrently_and_add_up(fixed):
    result = invoke("bench", fixed, "--device", "cpu", "--iterations", "5", "--warmup", "1", "--streams", "3",
                    "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["streams"] == 3 and d["iterations"] == 15 and [s["iterations"] for s in d["per_stream"]] == [5, 5, 5]
    assert d["throughput"]["queries_per_s"] == pytest.approx(15 / d["total_host_wall_s"])
    assert d["throughput"]["items_per_s"] == pytest.approx(4 * d["throughput"]["queries_per_s"])


def test_batch_percentiles_and_exported_times(dynamic, tmp_path):
    times = tmp_path / "times.json"
    result = invoke("bench", dynamic, "--device", "cpu", "--batch", "3", "--iterations", "4", "--percentiles",
                    "50,99.9", "--export-times", times, "--no-data-transfers", "--no-cuda-graph", "--spin-wait",
                    "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["shapes"] == {"x": [3, 4]} and d["batch"] == 3 and not d["data_transfers"] and d["spin_wait"]
    assert list(d["latency_ms"]) == ["min", "mean", "median", "p50", "p99.9", "max"]
    exported = json.loads(times.read_text())
    assert len(exported["iterations"]) == 4 and exported["unit"] == "ms"
    assert all(0 < it["compute_ms"] <= it["host_ms"] for it in exported["iterations"])
    starts = [it["start_ms"] for it in exported["iterations"]]
    assert starts == sorted(starts)


def test_text_summary_shows_phases_and_notes(fixed):
    result = invoke("bench", fixed, "--device", "cpu", "--iterations", "3", "--warmup", "0")
    assert result.exit_code == 0, result.output
    for words in ("Per-query phases", "compute", "total host wall time", "queries/s", "items/s",
                  "note: CPU backend"):
        assert words in result.stdout, words


def test_bench_user_errors_are_one_line(fixed, dynamic, tmp_path):
    assert_one_error_line(invoke("bench", fixed, "--device", "cpu", "--batch", "2"), "--batch", "fixed")
    plan = tmp_path / "chain.plan"
    assert invoke("build", fixed, "-o", plan, "--device", "cpu").exit_code == 0
    assert_one_error_line(invoke("bench", plan, "--batch", "2"), "--batch", "fixed shape")
    assert_one_error_line(invoke("bench", fixed, "--device", "cpu", "--batch", "0"), "--batch")
    assert_one_error_line(invoke("bench", fixed, "--device", "cpu", "--streams", "0"), "--streams")
    assert_one_error_line(invoke("bench", fixed, "--device", "cpu", "--percentiles", "99,x"), "--percentiles")
    # a dynamic batch and no --shapes: as trtexec, it runs with the dimension 1 and says so in one warning line
    result = invoke("bench", dynamic, "--device", "cpu", "--iterations", "2", "--json")
    assert result.exit_code == 0, result.output
    warning, = result.stderr.strip().splitlines()
    assert warning.startswith("warning: ") and "--shapes" in warning
    assert json.loads(result.stdout)["shapes"]["x"][0] == 1


def test_plot_draws_a_png(fixed, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    result = invoke("bench", fixed, "--device", "cpu", "--iterations", "5", "--dump-profile", "--plot", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(fixed, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert_one_error_line(invoke("bench", fixed, "--device", "cpu", "--iterations", "2", "--plot",
                                 tmp_path / "x.png"), "matplotlib", "pip install")


# -- on a GPU -----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_phases_add_up_and_pinned_io_round_trips(fixed):
    engine = kiln.build(fixed, kiln.BuildConfig(device="cuda"))
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    ctx = engine.create_context()
    want = ctx.run({"x": x})["y"]
    assert isinstance(want, np.ndarray)
    dev = torch.from_numpy(x).cuda()
    got = ctx.run({"x": dev})["y"]
    assert got.is_cuda and np.allclose(got.cpu().numpy(), want, atol=1e-5)
    assert ctx.run({"x": torch.from_numpy(x)})["y"].is_cuda  # torch in, torch out on the engine's device
    r = run_bench(engine, {"x": x}, BenchOptions(iterations=20, warmup=3, streams=2), batch=4)
    assert r.count == 40 and r.is_cuda
    for t in r.iterations:
        assert t.gpu_ms == pytest.approx(t.h2d_ms + t.compute_ms + t.d2h_ms, rel=1e-3, abs=1e-3)
    assert r.phases()["enqueue"] is not None and r.total_gpu_s() > 0


def test_separate_profile_run_profiles_after_the_timed_run(fixed):
    result = invoke("bench", fixed, "--device", "cpu", "--iterations", "4", "--separate-profile-run", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["iterations"] == 4 and d["profile"]["separate_run"] and d["profile"]["iterations"] == 4
    assert {r["layer"] for r in d["profile"]["layers"]} == {"mm1", "scale_up", "mm2"}
