"""One timed query split into phases: enqueue (host), H2D, GPU compute and D2H.

On CUDA, events recorded on the context's stream between the phases give each phase's device time and the
host clock gives the time spent enqueueing the compute; the CPU backend runs synchronously, so there only
the compute (and the whole query's wall time) is measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import torch

from kiln.runtime.context import ExecutionContext, to_host


@dataclass(frozen=True)
class IterationTimes:
    """One query's times in ms; `start_ms` from the start of the timed run; None where a phase is not measured."""

    stream: int
    start_ms: float
    host_ms: float
    compute_ms: float
    enqueue_ms: float | None = None
    h2d_ms: float | None = None
    d2h_ms: float | None = None
    gpu_ms: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


Pending = Callable[[], IterationTimes]  # reads the query's events once the run is over


class CpuQuery:
    """A query on the CPU backend: host clock around the whole call and around the kernels."""

    def __init__(self, ctx: ExecutionContext, feeds: Mapping[str, Any], stream: int = 0):
        self.ctx, self.feeds, self.stream = ctx, feeds, stream

    def __call__(self, origin: float) -> Pending:
        t0 = time.perf_counter()
        tensors, as_numpy = self.ctx.check(self.feeds)
        inputs = self.ctx.upload(tensors)
        t1 = time.perf_counter()
        out = self.ctx.execute(inputs)
        t2 = time.perf_counter()
        if as_numpy:
            self.ctx.download(out)
        t3 = time.perf_counter()
        times = IterationTimes(self.stream, (t0 - origin) * 1e3, (t3 - t0) * 1e3, (t2 - t1) * 1e3)
        return lambda: times


class CudaQuery:
    """A query on a CUDA context, issued on the current stream (the caller makes it the context's stream)."""

    def __init__(self, ctx: ExecutionContext, feeds: Mapping[str, Any], stream: int = 0, spin_wait: bool = False):
        self.ctx, self.feeds, self.stream, self.spin_wait = ctx, feeds, stream, spin_wait

    def __call__(self, origin: float) -> Pending:
        ctx = self.ctx
        start, uploaded, computed = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        # a blocking-sync event lets the host thread sleep while it waits; --spin-wait polls instead
        done = torch.cuda.Event(enable_timing=True, blocking=not self.spin_wait)
        t0 = time.perf_counter()
        tensors, as_numpy = ctx.check(self.feeds)
        start.record()
        inputs = ctx.upload(tensors)
        uploaded.record()
        t1 = time.perf_counter()
        out = ctx.execute(inputs)
        t2 = time.perf_counter()
        computed.record()
        staged = ctx.fetch(out) if as_numpy else out
        done.record()
        if self.spin_wait:
            while not done.query():
                pass
        else:
            done.synchronize()
        if as_numpy:
            {n: to_host(v) for n, v in staged.items()}
        t3 = time.perf_counter()
        host = (self.stream, (t0 - origin) * 1e3, (t3 - t0) * 1e3)

        def read() -> IterationTimes:
            h2d, d2h = start.elapsed_time(uploaded), computed.elapsed_time(done)
            transfers = as_numpy or any(isinstance(v, torch.Tensor) and not v.is_cuda for v in self.feeds.values())
            return IterationTimes(*host, compute_ms=uploaded.elapsed_time(computed), enqueue_ms=(t2 - t1) * 1e3,
                                  h2d_ms=h2d if transfers else None, d2h_ms=d2h if as_numpy else None,
                                  gpu_ms=start.elapsed_time(done))

        return read


def make_query(ctx: ExecutionContext, feeds: Mapping[str, Any], stream: int = 0, spin_wait: bool = False):
    """The query timer for `ctx`'s backend."""
    if ctx.stream is None:
        return CpuQuery(ctx, feeds, stream)
    return CudaQuery(ctx, feeds, stream, spin_wait)
