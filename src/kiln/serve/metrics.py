"""Prometheus metrics of one server, in its own registry (never prometheus_client's global one).

Under `kiln serve --workers N` each worker process counts into files of a shared folder (prometheus_client's
multiprocess mode: PROMETHEUS_MULTIPROC_DIR, set by the parent before the workers start) and `render` sums them, so
every worker's /metrics is the whole server's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
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

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry, or of every worker's where they share a folder."""
        shared = os.environ.get(MULTIPROCESS_ENV)
        if not shared:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=shared)
        return generate_latest(registry)
