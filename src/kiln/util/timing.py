"""Timing, written once: wall-clock and CUDA-event clocks, the autotuner's device time of a kernel, and `measure`
(untimed warm-up, then timed calls until an iteration count or a duration is reached).

The autotuner (builder), the layer profile and the query phases (bench) and the accuracy budget's engine timing
(quant) all time through here.
"""

from __future__ import annotations

import functools
import gc
import math
import statistics
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
# GPU spin ahead of each timed run (≈ 1 ms at 2 GHz) while the host launches it: Python launchers take 0.13-0.3 ms
# on an H100 host (benchmarks/probes/gpu_launch_cost_probe.py), and a launch that outlasts the spin adds its excess
# to the time
LAUNCH_COVER_CYCLES = 2_000_000


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


def cuda_event(blocking: bool = False) -> torch.cuda.Event:
    """A CUDA event that records time (`blocking`: the host thread sleeps while synchronizing on it)."""
    return torch.cuda.Event(enable_timing=True, blocking=blocking)


class CpuClock:
    """Wall-clock time of each call, per slot (the CPU backend runs synchronously)."""

    def __init__(self, slots: int = 1):
        self.ms: list[list[float]] = [[] for _ in range(slots)]

    def time(self, fn: Callable, *args, slot: int = 0):
        """`fn(*args)`, timed into `slot`; returns what it returns."""
        start = time.perf_counter()
        out = fn(*args)
        self.ms[slot].append((time.perf_counter() - start) * 1e3)
        return out

    def results_ms(self) -> list[tuple[float, ...]]:
        return [tuple(ms) for ms in self.ms]


class CudaClock:
    """Device time between CUDA events recorded around each call, per slot; read once, after one synchronize.

    With `spin_cycles`, a spin kernel runs ahead of each call: the host launches the call while the GPU spins,
    so the events see the device time, not the host's launch cost.
    """

    def __init__(self, slots: int = 1, spin_cycles: int = 0):
        self.events: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in range(slots)]
        self.spin_cycles = spin_cycles
        torch.cuda.synchronize()

    def time(self, fn: Callable, *args, slot: int = 0):
        """`fn(*args)` between two events, kept in `slot`; returns what it returns."""
        start, end = cuda_event(), cuda_event()
        if self.spin_cycles:
            torch.cuda._sleep(self.spin_cycles)
        start.record()
        out = fn(*args)
        end.record()
        self.events[slot].append((start, end))
        return out

    def results_ms(self) -> list[tuple[float, ...]]:
        torch.cuda.synchronize()
        return [tuple(s.elapsed_time(e) for s, e in pairs) for pairs in self.events]


def clock(device: str, slots: int = 1, spin_cycles: int = 0) -> CpuClock | CudaClock:
    """The clock for `device`: CUDA events on a GPU (spinning ahead of each call, if asked), else wall clock."""
    return CudaClock(slots, spin_cycles) if device.startswith("cuda") else CpuClock(slots)


def device_time_us(kernel: Callable, inputs, repeats: int, warmup: int = 3, cutoff_us: float | None = None) -> float:
    """Median device microseconds of `repeats` runs of `kernel(inputs)`, each between CUDA events. Every run is
    queued behind one spin kernel long enough to cover the host's enqueueing of all of them, so the GPU then runs
    them back to back and no launch cost (tens of µs in Triton's Python launcher) is counted, as none is in the CUDA
    graph an engine replays. Where the spin had ended before the host queued the last run (the host was slower
    than estimated, or a kernel waits for the GPU), each run gets a spin of its own instead. `cutoff_us`: the last
    warm-up run is timed too, and if even its time less the host's enqueueing exceeds the cutoff (a candidate far
    slower than the best so far) that time is returned at once. The garbage collector waits meanwhile (a collection
    would outlast the spin)."""
    for _ in range(warmup - 1):
        kernel(inputs)
    collecting = gc.isenabled()
    gc.disable()
    try:
        per_ms = _cycles_per_ms(torch.cuda.current_device())
        first, last = cuda_event(), cuda_event()
        first.record()
        start = time.perf_counter()
        kernel(inputs)  # the last warm-up run: what enqueueing a run costs the host, and an upper bound of its time
        host_ms = (time.perf_counter() - start) * 1e3
        last.record()
        last.synchronize()
        bound_us = first.elapsed_time(last) * 1000.0
        if cutoff_us is not None and bound_us - host_ms * 1000.0 > cutoff_us:
            return bound_us
        events = [(cuda_event(), cuda_event()) for _ in range(repeats)]
        torch.cuda._sleep(cover_cycles(repeats, host_ms, per_ms))
        spun = cuda_event()
        spun.record()
        for first, last in events:
            first.record()
            kernel(inputs)
            last.record()
        covered = not spun.query()  # the GPU still spun once every run was queued: it never waited for a launch
        events[-1][1].synchronize()
        if covered:
            return statistics.median(a.elapsed_time(b) * 1000.0 for a, b in events)
        times = []
        for _ in range(repeats):  # a spin per run
            first, last = cuda_event(), cuda_event()
            torch.cuda._sleep(LAUNCH_COVER_CYCLES)
            first.record()
            kernel(inputs)
            last.record()
            last.synchronize()
            times.append(first.elapsed_time(last) * 1000.0)
        return statistics.median(times)
    finally:
        if collecting:
            gc.enable()


MAX_COVER_MS = 50.0


def cover_cycles(repeats: int, host_ms: float, cycles_per_ms: float | None) -> int:
    """Spin cycles that outlast the host's enqueueing of `repeats` runs costing `host_ms` each (twice that, plus
    0.2 ms), at least LAUNCH_COVER_CYCLES and at most MAX_COVER_MS."""
    if not cycles_per_ms:
        return LAUNCH_COVER_CYCLES
    want = (2 * repeats * host_ms + 0.2) * cycles_per_ms
    return int(min(max(want, LAUNCH_COVER_CYCLES), MAX_COVER_MS * cycles_per_ms))


@functools.lru_cache(maxsize=None)
def _cycles_per_ms(device_index: int) -> float | None:
    return sleep_cycles_per_ms()


def sleep_cycles_per_ms() -> float | None:
    """How many clock cycles `torch.cuda._sleep` spins per millisecond on the current device (None without it)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    sleep(1000)
    start, end = cuda_event(), cuda_event()
    start.record()
    sleep(1_000_000)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    return 1_000_000 / ms if ms > 0 else None


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
    timer = clock(device)
    deadline = time.perf_counter() + duration if duration is not None else math.inf
    done = 0
    while True:
        timer.time(fn)
        done += 1
        if done >= (iterations or MAX_ITERATIONS) or time.perf_counter() >= deadline:
            break
    return LatencyStats(timer.results_ms()[0], batch, device, warmup)
