"""Prometheus metrics of one server, in its own registry (never prometheus_client's global one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TIME_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Metrics:
    """Request counters and batch / queue / compute / per-request stage histograms; `render()` gives the text
    exposition."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    content_type: str = CONTENT_TYPE_LATEST

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

    def request(self, model: str, version: str, status: str) -> None:
        """Count one finished request; `status` is "success" or the error's class name."""
        self.requests.labels(model=model, version=version, status=status).inc()

    def batch(self, model: str, size: int, compute_s: float, queue_s: list[float]) -> None:
        """Record one executed batch: its rows, engine time and each request's queue wait."""
        self.batch_size.labels(model=model).observe(size)
        self.compute_seconds.labels(model=model).observe(compute_s)
        for q in queue_s:
            self.queue_seconds.labels(model=model).observe(q)

    def stages(self, model: str, request_s: float, input_s: float, output_s: float) -> None:
        """Record one successful request's server-side time and its compute input / output stages."""
        self.request_seconds.labels(model=model).observe(request_s)
        self.compute_input_seconds.labels(model=model).observe(input_s)
        self.compute_output_seconds.labels(model=model).observe(output_s)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
