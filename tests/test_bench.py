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
