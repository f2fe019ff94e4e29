"""What one `kiln bench` run measured: per-query phase times, throughput, warnings, JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.bench.clocks import throttle_warning
from kiln.bench.phases import IterationTimes
from kiln.bench.stats import DEFAULT_PERCENTILES, spread, summarize

PHASES = ("host", "enqueue", "h2d", "compute", "d2h", "gpu")
VARIANCE_LIMIT = 0.025  # GPU time moving more than 2.5 % over the run makes a comparison unreliable


@dataclass
class BenchResult:
    """Every timed query (all streams, in start order) and the settings it ran under."""

    iterations: list[IterationTimes]
    wall_s: float
    batch: int
    device: str
    warmup: int
    streams: int = 1
    cuda_graph: bool = False
    data_transfers: bool = True
    spin_wait: bool = False
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    eager_reasons: dict[str, str] = field(default_factory=dict)
    clocks: dict | None = None
    launch_gaps_hidden: bool = False
    nvtx: bool = False
    first_calls_ms: list[float] = field(default_factory=list)  # per context (stream), its first call's host wall
    second_call_ms: float | None = None  # the first context's second call: a dynamic engine captures a new shape there
    shape_program: bool = False  # a dynamic engine with shape layers: its first call at a shape records their values

    @property
    def first_call_ms(self) -> float | None:
        """The first call at the benchmarked shapes (host wall, ms; the first context's): one-time work included
        (a dynamic engine's shape-program recording, the CUDA graph capture), kept apart from the steady state."""
        return self.first_calls_ms[0] if self.first_calls_ms else None

    def first_call_text(self) -> str | None:
        """The first call, what it includes, and how it compares with the steady-state median."""
        if self.first_call_ms is None:
            return None
        work = ["shape-program recording"] if self.shape_program else []
        work += ["CUDA graph capture"] if self.cuda_graph else []
        series = self.series("host")
        median = float(np.median(series)) if series else None
        ratio = f", {self.first_call_ms / median:,.1f}x the median" if median else ""
        later = " (a dynamic engine captures a shape at its second call)" if len(work) == 2 else ""
        second = f"; second call {self.second_call_ms:.3f} ms" if self.second_call_ms is not None and later else ""
        return (f"{self.first_call_ms:.3f} ms (first query at these shapes{ratio}"
                + (f"; with any one-time work at them: {' and '.join(work)}{later}" if work else "") + ")" + second
                + ("; also among the timed queries (--warmup 0)" if self.warmup == 0 else ""))

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def count(self) -> int:
        return len(self.iterations)

    def series(self, phase: str, stream: int | None = None) -> list[float] | None:
        """One phase's times (ms) in start order, or None when the phase was not measured."""
        values = [getattr(t, f"{phase}_ms") for t in self.iterations if stream is None or t.stream == stream]
        return None if not values or any(v is None for v in values) else values

    def phases(self) -> dict[str, dict[str, float] | None]:
        return {p: (summarize(s, self.percentiles) if (s := self.series(p)) else None) for p in PHASES}

    @property
    def queries_per_s(self) -> float:
        """Queries finished per second of host wall time, all streams together."""
        return self.count / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def items_per_s(self) -> float:
        return self.queries_per_s * self.batch

    def total_gpu_s(self) -> float | None:
        gpu = self.series("gpu")
        return sum(gpu) / 1e3 if gpu else None

    def warnings(self) -> list[str]:
        """What makes the numbers less than they seem: host- or transfer-bound throughput, unstable GPU time,
        throttled clocks."""
        out = []
        med = {p: float(np.median(s)) for p in PHASES if (s := self.series(p))}
        if "enqueue" in med and med["enqueue"] >= med["compute"]:
            out.append(f"throughput is bound by enqueue (host) time: {med['enqueue']:.3f} ms to enqueue vs "
                       f"{med['compute']:.3f} ms of GPU compute per query; "
                       + ("more --streams can hide it" if self.cuda_graph else
                          "--cuda-graph (or more --streams) can hide it"))
        transfers = med.get("h2d", 0.0) + med.get("d2h", 0.0)
        if transfers and transfers >= med["compute"]:
            out.append(f"throughput is bound by data transfers: H2D {med.get('h2d', 0):.3f} ms + D2H "
                       f"{med.get('d2h', 0):.3f} ms vs {med['compute']:.3f} ms of compute per query; "
                       "--no-data-transfers measures the engine alone")
        # on the CPU backend, time at this scale always jitters by more than the limit: GPU runs only
        moved = spread(self.series("compute", stream=0) or []) if self.is_cuda else None
        if moved is not None and moved > VARIANCE_LIMIT:
            out.append(f"GPU compute time varies by {100 * moved:.1f} % over the run (medians of its quarters), over "
                       f"{100 * VARIANCE_LIMIT:.1f} %: something else may be using the device; run longer "
                       "(--duration) or on an idle machine")
        if (w := throttle_warning(self.clocks)) is not None:
            out.append(w)
        return out

    def notes(self) -> list[str]:
        out = []
        if not self.is_cuda:
            out.append("CPU backend: queries run synchronously, so only compute (and host wall time) is measured; "
                       "there is no enqueue, H2D or D2H phase")
        else:
            if not self.data_transfers:
                out.append("--no-data-transfers: inputs are already on the device and outputs stay there")
            if self.launch_gaps_hidden:
                out.append("GPU phases are timed with the GPU kept busy (a short spin kernel) while the host "
                           "enqueues each query: they are the GPU's work, without waits for the host")
        if self.nvtx:
            out.append("--nvtx: each layer is an NVTX range; the layers ran eagerly, without CUDA graph replay, so "
                       "latency includes their launches" if self.is_cuda else
                       "--nvtx has no effect on the CPU backend (no CUDA)")
        out += [f"CUDA graph not used for inputs {sig}: {why}" for sig, why in self.eager_reasons.items()]
        return out

    def to_json(self) -> dict:
        phases = self.phases()
        return {"device": self.device, "warmup": self.warmup, "iterations": self.count, "batch": self.batch,
                "streams": self.streams, "cuda_graph": self.cuda_graph, "data_transfers": self.data_transfers,
                "spin_wait": self.spin_wait,
                "launch_gaps_hidden": self.launch_gaps_hidden, "percentiles": list(self.percentiles),
                "latency_ms": phases["host"], "phases_ms": phases, "first_call_ms": self.first_call_ms,
                "second_call_ms": self.second_call_ms,
                "first_call_per_stream_ms": list(self.first_calls_ms) if self.streams > 1 else [],
                "total_host_wall_s": self.wall_s, "total_gpu_s": self.total_gpu_s(),
                "throughput": {"queries_per_s": self.queries_per_s, "items_per_s": self.items_per_s},
                "per_stream": [{"stream": s, "iterations": len(self.series("host", s) or []),
                                "latency_ms": summarize(self.series("host", s), self.percentiles)}
                               for s in range(self.streams) if self.series("host", s)] if self.streams > 1 else [],
                "clocks": self.clocks, "warnings": self.warnings(), "notes": self.notes()}
