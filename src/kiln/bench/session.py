"""A `kiln bench` run: warm-up, then timed queries on one or more execution contexts (one per stream,
each driven by its own thread so that their queries overlap on the device) until a count or a duration."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from kiln.bench.clocks import read_clocks
from kiln.bench.phases import IterationTimes, make_query
from kiln.bench.result import BenchResult
from kiln.bench.stats import DEFAULT_PERCENTILES
from kiln.errors import ConfigError
from kiln.kinds.interpret import to_device
from kiln.runtime.context import ExecutionContext
from kiln.runtime.cuda_graph import DEFAULT_MAX_GRAPHS
from kiln.runtime.io import as_torch
from kiln.util.timing import (DEFAULT_DURATION_S, DEFAULT_ITERATIONS, MAX_ITERATIONS, check_stopping,
                               sleep_cycles_per_ms)


@dataclass(frozen=True)
class BenchOptions:
    """How to run: stopping rule (per stream), warm-up, streams, CUDA graphs, transfers, how the host waits."""

    iterations: int | None = None
    duration: float | None = None
    warmup: int = 10
    streams: int = 1
    cuda_graph: bool | None = None       # None: as the engine was built
    data_transfers: bool = True          # False: inputs already on the device, outputs left there
    spin_wait: bool = False
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    hide_launch_gaps: bool = True        # keep the GPU busy while the host enqueues, so events time GPU work only
    nvtx: bool = False                   # an NVTX range per layer (CUDA; layers run eagerly, no graph replay)
    max_cuda_graphs: int = DEFAULT_MAX_GRAPHS  # input signatures each context keeps a captured graph for

    def checked(self) -> "BenchOptions":
        """The options with the default stopping rule filled in; a bad value is a ConfigError."""
        check_stopping(self.iterations, self.duration, self.warmup)
        if not 1 <= self.streams <= 64:
            raise ConfigError(f"--streams must be between 1 and 64, got {self.streams}")
        if not 0 <= self.max_cuda_graphs <= 100_000:
            raise ConfigError(f"--max-cuda-graphs must be between 0 and 100000, got {self.max_cuda_graphs}")
        if self.iterations is None and self.duration is None:
            return replace(self, iterations=DEFAULT_ITERATIONS, duration=DEFAULT_DURATION_S)
        return self


class _Clock:
    """The shared start of the timed run and its deadline, set once every stream has warmed up."""

    def __init__(self, duration: float | None):
        self.duration, self.origin, self.deadline = duration, 0.0, math.inf

    def start(self) -> None:
        self.origin = time.perf_counter()
        self.deadline = self.origin + self.duration if self.duration is not None else math.inf


def run_bench(engine, feeds: Mapping[str, Any], options: BenchOptions, batch: int = 1) -> BenchResult:
    """Time `engine` on host `feeds` (numpy) as `options` say; without data transfers they are moved to the
    device once, first, and the outputs stay there."""
    opts = options.checked()
    if not opts.data_transfers:
        dev = engine.device.torch_device
        feeds = {k: to_device(as_torch(k, v)[0], dev) for k, v in feeds.items()}
    cuda = engine.device.backend == "cuda"
    contexts = [ExecutionContext(engine, cuda_graph=opts.cuda_graph, nvtx=opts.nvtx and cuda,
                                 max_cuda_graphs=opts.max_cuda_graphs)
                for _ in range(opts.streams)]
    cycles_per_ms = sleep_cycles_per_ms() if cuda and opts.hide_launch_gaps else None
    clock = _Clock(opts.duration)
    barrier = threading.Barrier(opts.streams, action=clock.start)
    results: list[list[IterationTimes]] = [[] for _ in contexts]
    ends = [0.0] * len(contexts)
    # each context's first call (ms, host wall): at the benchmarked shapes it records a dynamic engine's shape program
    # (whose graph is captured at the second call) or captures a static engine's graph; a warm-up query, outside the
    # timed ones unless --warmup 0
    first: list[float | None] = [None] * len(contexts)
    second: list[float | None] = [None]  # the first context's second call (a dynamic engine's capture at a new shape)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        ctx = contexts[k]
        try:
            with torch.cuda.stream(ctx.stream) if ctx.stream is not None else contextlib.nullcontext():
                query = make_query(ctx, feeds, k, opts.spin_wait, cycles_per_ms)
                for i in range(opts.warmup):
                    times = query(0.0)
                    if i == 0 and first[k] is None:
                        first[k] = times().host_ms
                    elif i == 1 and k == 0 and second[0] is None:
                        second[0] = times().host_ms
                barrier.wait()
                pending, done = [], 0
                while True:
                    pending.append(query(clock.origin))
                    if done == 0 and first[k] is None:  # --warmup 0: the first timed query is the first call
                        first[k] = pending[-1]().host_ms
                    elif opts.warmup + done == 1 and k == 0 and second[0] is None:  # --warmup 0 or 1: timed
                        second[0] = pending[-1]().host_ms
                    done += 1
                    counted_out = done >= (opts.iterations or MAX_ITERATIONS)
                    if counted_out or time.perf_counter() >= clock.deadline:
                        break
                ends[k] = time.perf_counter()
                results[k] = [p() for p in pending]
        except threading.BrokenBarrierError:
            pass  # another stream failed; its error is the one reported
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, re-raised there
            errors.append(e)
            barrier.abort()

    if opts.streams == 1:
        worker(0)
    else:
        for k, ctx in enumerate(contexts):  # first and second runs (recording, capture), one context at a time
            with torch.cuda.stream(ctx.stream) if ctx.stream is not None else contextlib.nullcontext():
                query = make_query(ctx, feeds, k, False, None)
                first[k] = query(0.0)().host_ms
                second_ms = query(0.0)().host_ms
                if k == 0:
                    second[0] = second_ms
        threads = [threading.Thread(target=worker, args=(k,), name=f"kiln-bench-{k}") for k in range(opts.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    clocks = read_clocks(engine.device.torch_device) if cuda else None
    eager = {str(sig): why for ctx in contexts for sig, why in ctx.eager_reasons.items()}
    every = sorted((t for r in results for t in r), key=lambda t: t.start_ms)
    return BenchResult(every, max(ends) - clock.origin, batch, engine.device.torch_device, opts.warmup,
                       opts.streams, cuda_graph=any(c.graphs is not None and c.graphs.runs for c in contexts),
                       data_transfers=opts.data_transfers, spin_wait=opts.spin_wait, percentiles=opts.percentiles,
                       eager_reasons=eager, clocks=clocks, launch_gaps_hidden=cycles_per_ms is not None,
                       nvtx=opts.nvtx, first_calls_ms=[t for t in first if t is not None],
                       second_call_ms=second[0],
                       shape_program=bool(engine.shape_program))
