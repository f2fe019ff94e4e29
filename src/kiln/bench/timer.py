"""Time a callable: untimed warm-up, then timed calls until an iteration count or a duration is reached."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kiln.errors import ConfigError

DEFAULT_ITERATIONS = 100
DEFAULT_DURATION_S = 10.0
MAX_ITERATIONS = 10_000_000   # per stream, also ends a --duration run: every query's times are kept in memory
MAX_DURATION_S = 86_400.0     # one day


def check_stopping(iterations: int | None, duration: float | None, warmup: int) -> None:
    """A ConfigError for a count or duration that is not positive, or would run past the maxima above."""
    if iterations is not None and not 1 <= iterations <= MAX_ITERATIONS:
        raise ConfigError(f"--iterations must be between 1 and {MAX_ITERATIONS:,}, got {iterations}")
    if duration is not None and not 0 < duration <= MAX_DURATION_S:
        raise ConfigError(f"--duration must be a number of seconds above 0 and at most {MAX_DURATION_S:,.0f} "
                          f"(one day), got {duration}")
    if not 0 <= warmup <= MAX_ITERATIONS:
        raise ConfigError(f"--warmup must be between 0 and {MAX_ITERATIONS:,}, got {warmup}")


@dataclass(frozen=True)
class LatencyStats:
    """Per-call latencies (ms) of one measurement, with the batch size each call processed."""

    latencies_ms: tuple[float, ...]
    batch: int = 1
    device: str = "cpu"
    warmup: int = 0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))

    @property
    def count(self) -> int:
        return len(self.latencies_ms)

    @property
    def min(self) -> float:
        return min(self.latencies_ms)

    @property
    def max(self) -> float:
        return max(self.latencies_ms)

    @property
    def mean(self) -> float:
        return float(np.mean(self.latencies_ms))

    @property
    def median(self) -> float:
        return self.percentile(50)

    @property
    def p90(self) -> float:
        return self.percentile(90)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    @property
    def queries_per_s(self) -> float:
        """Calls per second, back to back: 1 / mean latency."""
        return 1000.0 / self.mean if self.mean > 0 else math.inf

    @property
    def items_per_s(self) -> float:
        """Samples per second: calls per second times the batch size."""
        return self.queries_per_s * self.batch

    def to_json(self) -> dict:
        keys = ("min", "mean", "median", "p90", "p99", "max")
        return {"device": self.device, "warmup": self.warmup, "iterations": self.count, "batch": self.batch,
                "latency_ms": {k: getattr(self, k) for k in keys},
                "throughput": {"queries_per_s": self.queries_per_s, "items_per_s": self.items_per_s}}


class _CpuTimer:
    """Wall-clock time of each call (the CPU backend runs synchronously)."""

    def __init__(self):
        self.ms: list[float] = []

    def time(self, fn: Callable[[], object]) -> None:
        start = time.perf_counter()
        fn()
        self.ms.append((time.perf_counter() - start) * 1e3)

    def results_ms(self) -> list[float]:
        return self.ms


class _CudaTimer:
    """Device time between CUDA events recorded around each call; read once, after one synchronize."""

    def __init__(self):
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        torch.cuda.synchronize()

    def time(self, fn: Callable[[], object]) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        self.events.append((start, end))

    def results_ms(self) -> list[float]:
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in self.events]


def measure(fn: Callable[[], object], *, device: str = "cpu", warmup: int = 10, iterations: int | None = None,
            duration: float | None = None, batch: int = 1) -> LatencyStats:
    """Time `fn()` until `iterations` calls are done or `duration` seconds have passed, whichever comes first.

    Give only one of the two to use only it; with neither, the defaults (100 calls or 10 s) apply.
    """
    if iterations is None and duration is None:
        iterations, duration = DEFAULT_ITERATIONS, DEFAULT_DURATION_S
    check_stopping(iterations, duration, warmup)
    for _ in range(warmup):
        fn()
    timer = _CudaTimer() if device.startswith("cuda") else _CpuTimer()
    deadline = time.perf_counter() + duration if duration is not None else math.inf
    done = 0
    while True:
        timer.time(fn)
        done += 1
        if done >= (iterations or MAX_ITERATIONS) or time.perf_counter() >= deadline:
            break
    return LatencyStats(tuple(timer.results_ms()), batch, device, warmup)
