"""One timed query split into phases: enqueue (host), H2D, GPU compute and D2H.

On CUDA, events recorded on the context's stream between the phases give each phase's device time and the
host clock gives the time spent enqueueing the compute; the CPU backend runs synchronously, so there only
the compute (and the whole query's wall time) is measured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import torch

from kiln.kinds.interpret import to_host
from kiln.runtime.context import ExecutionContext
from kiln.util.timing import cuda_event


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
    """A query on a CUDA context, issued on the current stream (the caller makes it the context's stream).

    With `cycles_per_ms`, a spin kernel lasting a little longer than the host needs to enqueue the query runs
    first, so the GPU is still busy when the query's kernels arrive: the events then time the GPU's work, not
    the gaps where it waited for the host (those show as enqueue time).
    """

    PRIME_MARGIN = 1.15
    PRIME_WINDOW = 16

    def __init__(self, ctx: ExecutionContext, feeds: Mapping[str, Any], stream: int = 0, spin_wait: bool = False,
                 cycles_per_ms: float | None = None):
        self.ctx, self.feeds, self.stream, self.spin_wait = ctx, feeds, stream, spin_wait
        self.cycles_per_ms = cycles_per_ms
        self.spans_ms: list[float] = []  # host time to enqueue each recent query

    def _prime(self) -> None:
        if self.cycles_per_ms and self.spans_ms:
            ms = self.PRIME_MARGIN * statistics.median(self.spans_ms[-self.PRIME_WINDOW:])
            torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def __call__(self, origin: float) -> Pending:
        ctx = self.ctx
        start, uploaded, computed = (cuda_event() for _ in range(3))
        # a blocking-sync event lets the host thread sleep while it waits; --spin-wait polls instead
        done = cuda_event(blocking=not self.spin_wait)
        t0 = time.perf_counter()
        tensors, as_numpy = ctx.check(self.feeds)
        self._prime()
        t_issue = time.perf_counter()
        start.record()
        inputs = ctx.upload(tensors)
        uploaded.record()
        t1 = time.perf_counter()
        out = ctx.execute(inputs)
        t2 = time.perf_counter()
        computed.record()
        staged = ctx.fetch(out) if as_numpy else out
        done.record()
        self.spans_ms = self.spans_ms[-self.PRIME_WINDOW:] + [(time.perf_counter() - t_issue) * 1e3]
        if self.spin_wait:
            while not done.query():
                pass
        else:
            done.synchronize()
        if as_numpy:  # what ctx.run hands back: numpy arrays over the pinned buffers
            for value in staged.values():
                to_host(value)
        t3 = time.perf_counter()
        host = (self.stream, (t0 - origin) * 1e3, (t3 - t0) * 1e3)

        def read() -> IterationTimes:
            h2d, d2h = start.elapsed_time(uploaded), computed.elapsed_time(done)
            transfers = as_numpy or any(isinstance(v, torch.Tensor) and not v.is_cuda for v in self.feeds.values())
            return IterationTimes(*host, compute_ms=uploaded.elapsed_time(computed), enqueue_ms=(t2 - t1) * 1e3,
                                  h2d_ms=h2d if transfers else None, d2h_ms=d2h if as_numpy else None,
                                  gpu_ms=start.elapsed_time(done))

        return read


def make_query(ctx: ExecutionContext, feeds: Mapping[str, Any], stream: int = 0, spin_wait: bool = False,
               cycles_per_ms: float | None = None):
    """The query timer for `ctx`'s backend."""
    if ctx.stream is None:
        return CpuQuery(ctx, feeds, stream)
    return CudaQuery(ctx, feeds, stream, spin_wait, cycles_per_ms)
