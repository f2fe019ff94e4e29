"""Prometheus metrics of one server, in its own registry (never prometheus_client's global one).

Under `kiln serve --workers N` each worker process counts into files of a shared folder (prometheus_client's
multiprocess mode: PROMETHEUS_MULTIPROC_DIR, set by the parent before the workers start) and `render` sums them, so
every worker's /metrics is the whole server's. The v2 statistics are summed the same way: each worker publishes its
models' statistics as JSON to stats-<worker index>.json in that folder (`SharedStatistics`), and a statistics request
adds the other workers' latest snapshots to the answering worker's own (`sum_statistics`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STATS_REFRESH_S = 0.2  # how often a worker publishes its statistics (when they changed)
_BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LOOP_SAMPLE_S = 0.05  # how often watch_loop measures the event loop's lag
TIME_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Metrics:
    """Request counters and batch / queue / compute / per-request stage histograms; `render()` gives the text
    exposition."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    content_type: str = CONTENT_TYPE_LATEST
    _children: dict = field(default_factory=dict, init=False, repr=False)  # (metric, labels) → its labelled child

    def __post_init__(self):
        self.requests = Counter("kiln_inference_requests_total", "Inference requests by outcome.",
                                ["model", "version", "status"], registry=self.registry)
        self.batch_size = Histogram("kiln_inference_batch_size", "Rows per executed batch.", ["model"],
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.queue_seconds = Histogram("kiln_inference_queue_seconds", "Time a request waited in the queue.",
                                       ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.compute_seconds = Histogram("kiln_inference_compute_seconds", "Engine time per executed batch.",
                                         ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.request_seconds = Histogram("kiln_inference_request_seconds",
                                         "Server-side time of a successful request, protocol decode to encode.",
                                         ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.compute_input_seconds = Histogram("kiln_inference_compute_input_seconds",
                                               "Request decode and batch input assembly per successful request.",
                                               ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.compute_output_seconds = Histogram("kiln_inference_compute_output_seconds",
                                                "Batch output split and response encoding per successful request.",
                                                ["model"], buckets=TIME_BUCKETS, registry=self.registry)
        self.frontend_seconds = Histogram("kiln_frontend_request_seconds",
                                          "Under --frontends: a front end's time for a successful request, protocol "
                                          "decode to encode, the link round trip included.", ["model"],
                                          buckets=TIME_BUCKETS, registry=self.registry)
        self.link_seconds = Histogram("kiln_frontend_link_seconds",
                                      "Under --frontends: a request's round trip over the link to the engine process, "
                                      "as its front end sees it (the engine's kiln_inference_request_seconds is the "
                                      "part inside the engine process).", ["model"], buckets=TIME_BUCKETS,
                                      registry=self.registry)

        self.loop_lag = Histogram("kiln_event_loop_lag_seconds",
                                  f"How late the event loop ran a timer set {LOOP_SAMPLE_S * 1e3:g} ms ahead, by "
                                  "server process: lags of milliseconds mean the process is saturated and requests "
                                  "wait for it.", ["process"], buckets=LAG_BUCKETS, registry=self.registry)
        self.registry.register(GpuMemory())

    def _child(self, metric, *labels: str):
        """`metric.labels(*labels)`, looked up once: prometheus_client validates and locks on every call."""
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[metric, labels] = metric.labels(*labels)
        return child

    def request(self, model: str, version: str, status: str) -> None:
        """Count one finished request; `status` is "success" or the error's class name."""
        self._child(self.requests, model, version, status).inc()

    def batch(self, model: str, size: int, compute_s: float, queue_s: list[float]) -> None:
        """Record one executed batch: its rows, engine time and each request's queue wait."""
        self._child(self.batch_size, model).observe(size)
        self._child(self.compute_seconds, model).observe(compute_s)
        queue = self._child(self.queue_seconds, model)
        for q in queue_s:
            queue.observe(q)

    def stages(self, model: str, request_s: float, input_s: float, output_s: float) -> None:
        """Record one successful request's server-side time and its compute input / output stages."""
        self._child(self.request_seconds, model).observe(request_s)
        self._child(self.compute_input_seconds, model).observe(input_s)
        self._child(self.compute_output_seconds, model).observe(output_s)

    def frontend(self, model: str, request_s: float, link_s: float) -> None:
        """Record one successful request in a front end: its time there and its link round trip."""
        self._child(self.frontend_seconds, model).observe(request_s)
        self._child(self.link_seconds, model).observe(link_s)

    async def watch_loop(self, process: str, interval_s: float = LOOP_SAMPLE_S) -> None:
        """Observe the running loop's lag as `process` every `interval_s` until cancelled."""
        loop, lag = asyncio.get_running_loop(), self._child(self.loop_lag, process)
        while True:
            start = loop.time()
            await asyncio.sleep(interval_s)
            lag.observe(max(0.0, loop.time() - start - interval_s))

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry, or of every worker's where they share a folder."""
        shared = os.environ.get(MULTIPROCESS_ENV)
        if not shared:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=shared)
        registry.register(GpuMemory())  # the answering process's GPUs, read now
        return generate_latest(registry)


class GpuMemory:
    """GPU memory read at each scrape, per GPU this process uses: its torch allocations (allocated, reserved by the
    caching allocator) and the whole device's used and total bytes. Nothing where this process never started CUDA
    (a CPU server, a front end of --frontends), so a scrape never starts it."""

    GAUGES = {"allocated": "Bytes of GPU memory this process's tensors hold (torch's allocator).",
              "reserved": "Bytes of GPU memory this process's allocator holds (allocated plus its cache).",
              "used": "Bytes of the GPU's memory in use by every process (total less free).",
              "total": "Bytes of the GPU's memory."}

    def collect(self):
        torch = sys.modules.get("torch")  # never imported (nor CUDA started) for a scrape
        if torch is None or not torch.cuda.is_initialized():
            return []
        families = {k: GaugeMetricFamily(f"kiln_gpu_memory_{k}_bytes", doc, labels=["gpu"])
                    for k, doc in self.GAUGES.items()}
        for i in range(torch.cuda.device_count()):
            if i != torch.cuda.current_device() and not torch.cuda.memory_reserved(i):
                continue  # a GPU this process has no memory on: asking its free memory would start a context there
            free, total = torch.cuda.mem_get_info(i)
            for k, v in (("allocated", torch.cuda.memory_allocated(i)), ("reserved", torch.cuda.memory_reserved(i)),
                         ("used", total - free), ("total", total)):
                families[k].add_metric([str(i)], float(v))
        return list(families.values())


def _add_duration(a: dict, b: dict) -> dict:
    """Two statistics durations ({count, ns}) added."""
    return {"count": int(a.get("count", 0)) + int(b.get("count", 0)), "ns": int(a.get("ns", 0)) + int(b.get("ns", 0))}


def _add_batches(a: list, b: list) -> list:
    """Two batch_stats lists merged by batch size (durations added), sorted by batch size."""
    sizes: dict[int, dict] = {}
    for entry in [*a, *b]:
        size = int(entry["batch_size"])
        prev = sizes.get(size, {})
        sizes[size] = {"batch_size": size, **{k: _add_duration(prev.get(k, {}), entry.get(k, {}))
                                              for k in _BATCH_DURATIONS}}
    return [sizes[size] for size in sorted(sizes)]


def _add_entry(a: dict, b: dict) -> dict:
    """One model version's statistics entry `a` with `b` (another worker's) added; last_inference is the later."""
    stats_b = b.get("inference_stats", {})
    return {**a, "last_inference": max(int(a.get("last_inference", 0)), int(b.get("last_inference", 0))),
            "inference_count": int(a.get("inference_count", 0)) + int(b.get("inference_count", 0)),
            "execution_count": int(a.get("execution_count", 0)) + int(b.get("execution_count", 0)),
            "inference_stats": {k: _add_duration(v, stats_b.get(k, {})) for k, v in a["inference_stats"].items()},
            "batch_stats": _add_batches(a.get("batch_stats", []), b.get("batch_stats", []))}


def _add_snapshot(total: list[dict], snapshot: list[dict]) -> list[dict]:
    """`total` with one worker's snapshot added entry by entry (same name and version)."""
    theirs = {(e["name"], str(e["version"])): e for e in snapshot}
    return [_add_entry(e, theirs[key]) if (key := (e["name"], str(e["version"]))) in theirs else e for e in total]


def sum_statistics(own: list[dict], snapshots: Iterable) -> list[dict]:
    """`own` statistics entries (Triton's model_stats) with each other worker's snapshot added; a snapshot that is not
    such a list (corrupt) is skipped. Only `own`'s model versions are reported."""
    total = list(own)
    for snapshot in snapshots:
        with contextlib.suppress(TypeError, ValueError, AttributeError, KeyError):
            total = _add_snapshot(total, snapshot)
    return total


def read_snapshots(folder: str | Path, skip: int | None = None) -> list:
    """The model_stats each worker last wrote to `folder`/stats-<index>.json, but worker `skip`'s; a missing, partial
    or corrupt file is left out."""
    found = []
    for path in sorted(Path(folder).glob("stats-*.json")):
        if path.name == f"stats-{skip}.json":
            continue
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            found.append(json.loads(path.read_bytes())["model_stats"])
    return found


@dataclass
class SharedStatistics:
    """One worker's part in the statistics of `kiln serve --workers N`: it publishes its own to
    `folder`/stats-<index>.json and adds the other workers' latest ones to its own."""

    folder: str
    index: int
    refresh_s: float = STATS_REFRESH_S
    _last: list | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_env(cls, index: int | None) -> SharedStatistics | None:
        """Worker `index`'s, in the metrics folder its parent shares (MULTIPROCESS_ENV); None outside a worker."""
        folder = os.environ.get(MULTIPROCESS_ENV)
        return cls(folder, index) if index is not None and folder else None

    def combine(self, own: list[dict]) -> list[dict]:
        """`own` statistics entries summed with the other workers' latest snapshots."""
        return sum_statistics(own, read_snapshots(self.folder, self.index))

    def publish(self, entries: list[dict]) -> None:
        """Write `entries` as this worker's snapshot, if they changed: to a temp file, then os.replace (atomic)."""
        if entries == self._last:
            return
        path = Path(self.folder) / f"stats-{self.index}.json"
        tmp = path.with_name(f".stats-{self.index}.tmp")
        tmp.write_text(json.dumps({"worker": self.index, "model_stats": entries}))
        os.replace(tmp, path)
        self._last = entries

    async def run(self, snapshot: Callable[[], list[dict]]) -> None:
        """Publish `snapshot()` every `refresh_s` until cancelled (a failed write is tried again next time)."""
        while True:
            with contextlib.suppress(OSError):
                self.publish(snapshot())
            await asyncio.sleep(self.refresh_s)


def statistics_of(models: Iterable, shared: SharedStatistics | None = None) -> list[dict]:
    """Triton's model_stats of `models` (`ServedModel`s): this process's, summed over every worker when `shared`."""
    own = [m.statistics() for m in models]
    return own if shared is None else shared.combine(own)
