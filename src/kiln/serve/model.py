"""One loaded model: validates requests, queues them into its batcher, keeps Triton-style statistics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kiln.serve.batcher import BatchRecord, DynamicBatcher, RequestTiming
from kiln.serve import INLINE_US
from kiln.serve.config import ModelConfig
from kiln.serve.dtypes import NUMPY_TO_V2, V2_TO_NUMPY, torch_dtype
from kiln.serve.errors import BadRequest, ServeError
from kiln.errors import InputError, KilnError
from kiln.runtime.io import check_indices, index_bounds
from kiln.serve.logs import REQUESTS, event
from kiln.serve.metrics import Metrics


_REQUEST_LOG = logging.getLogger(REQUESTS)


@dataclass
class Duration:
    """A count and total nanoseconds, as Triton's statistics report them."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStats:
    """One batch size's executions: input assembly, engine and output split time (count = batches)."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class Stats:
    """Per-model counters: requests (success / fail; queue and compute stages of the successful ones) and
    per-batch-size compute."""

    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStats] = field(default_factory=dict)


@dataclass(eq=False)
class ServedModel:
    """A model version ready to serve: `.name`, `.version`, `.config`, `infer`, `metadata`, `statistics`."""

    name: str
    version: str
    config: ModelConfig
    engine: object
    metrics: Metrics = field(default_factory=Metrics)
    stats: Stats = field(default_factory=Stats)
    versions: list[str] = field(default_factory=list)  # every loaded version of the model (set by the repository)
    inline_us: int = INLINE_US  # lone requests whose shape last ran within this many µs run on the event loop

    def __post_init__(self):
        cfg, db = self.config, self.config.dynamic_batching
        padding = db.padding if db is not None else None
        self.batcher = DynamicBatcher(
            self.engine, max_batch_size=cfg.max_batch_size or 0 if db is not None else 0,
            preferred_batch_size=list(db.preferred_batch_size) if db else [],
            max_queue_delay_s=db.max_queue_delay_microseconds / 1e6 if db else 0.0,
            max_queue_size=db.max_queue_size if db else 0, reject_status=db.reject_status if db else 503,
            instance_count=cfg.instance_count, on_batch=self._on_batch, name=self.name, padding=padding,
            padding_limits=_padding_limits(self.engine, padding) if padding is not None else [],
            batch_buckets=_batch_buckets(self.engine, cfg), length_multiple=_length_multiple(self.engine, padding),
            inline_s=self.inline_us / 1e6)
        self._default_timeout_s = db.default_timeout_microseconds / 1e6 if db else 0.0
        batch = [-1] if cfg.max_batch_size else []
        self._input_spec = {t.name: (V2_TO_NUMPY[t.data_type], t.data_type, batch + list(t.dims)) for t in cfg.input}
        self._output_names = frozenset(t.name for t in cfg.output)
        # ids into embedding tables, checked here: the engine gets them on the device, where they are not read back
        self._index_bounds = index_bounds(self.engine.network) if hasattr(self.engine, "network") else {}
        self.warmed = self._warm_up()

    def _warm_up(self) -> list[int]:
        """Run every context at each batch bucket (config `warmup`, see config.DynamicBatching): the buckets warmed.
        Zeros a model refuses leave it cold, with a warning, never unloaded."""
        db, buckets = self.config.dynamic_batching, self.batcher.batch_buckets
        on = db.warmup if db is not None and db.warmup is not None else bool(buckets) and db.padding is None
        if not on or not buckets or any(d < 0 for t in self.config.input for d in t.dims):
            return []
        start = time.perf_counter()
        for rows in buckets:
            feeds = {t.name: np.zeros([rows, *t.dims], V2_TO_NUMPY[t.data_type]) for t in self.config.input}
            try:
                self.batcher.run_each_context(feeds)
            except KilnError as e:
                event(f"model {self.name} version {self.version}: warm-up at batch {rows} failed ({e}); batches of "
                      "that size pay their first call", logging.WARNING, event="warmup_failed", model=self.name,
                      version=self.version, batch=rows, reason=str(e))
                return []
        seconds = round(time.perf_counter() - start, 3)
        event(f"model {self.name} version {self.version}: warmed {self.config.instance_count} context(s) at batch "
              f"sizes {buckets} in {seconds} s", event="warmup", model=self.name, version=self.version,
              batches=list(buckets), seconds=seconds)
        return list(buckets)

    def metadata(self) -> dict:
        """KServe v2 model metadata; shapes carry -1 for the batch dim of a batched model."""
        batch = [-1] if self.config.max_batch_size else []
        return {"name": self.name, "versions": list(self.versions or [self.version]), "platform": self.config.platform,
                "inputs": [{"name": t.name, "datatype": t.data_type, "shape": batch + list(t.dims)}
                           for t in self.config.input],
                "outputs": [{"name": t.name, "datatype": t.data_type, "shape": batch + list(t.dims)}
                            for t in self.config.output]}

    async def infer(self, inputs: dict[str, np.ndarray], requested: list[str] | None = None,
                    timeout_s: float | None = None, *, start_ns: int | None = None, decode_ns: int = 0,
                    encode: Callable[[dict[str, np.ndarray]], Any] | None = None, shm_outputs=None) -> Any:
        """Run one request: validated, queued, batched; returns this request's `requested` outputs (None: all), or
        `encode(outputs)`. A protocol handler passes its entry time `start_ns` and decode time `decode_ns`
        (perf_counter_ns) and its response encoder `encode`, so that the statistics cover the whole request.
        `shm_outputs` (outputs bound for shared memory) is for a front end's model: here `encode` writes them."""
        start = time.perf_counter_ns()
        begin, timing = start if start_ns is None else start_ns, RequestTiming()
        try:
            rows = self._validate(inputs, requested)
            timing.input_ns = decode_ns + time.perf_counter_ns() - start
            timeout = timeout_s if timeout_s is not None else self._default_timeout_s
            outputs = await self.batcher.submit(dict(inputs), rows, timeout or None, timing,
                                                None if requested is None else frozenset(requested))
            answered = time.perf_counter_ns()
            result = {k: outputs[k] for k in (requested if requested is not None else outputs)}
            if encode is not None:
                result = encode(result)
            timing.output_ns += time.perf_counter_ns() - answered
        except ServeError as e:
            self._finish(begin, type(e).__name__, ok=False)
            raise
        except BaseException:  # cancelled (client gone) or a bug: still counted once
            self._finish(begin, "Cancelled", ok=False)
            raise
        self._finish(begin, "success", ok=True, timing=timing)
        return result

    def statistics(self) -> dict:
        """This model's entry of Triton's statistics JSON."""
        s, zero = self.stats, Duration().to_json()
        return {"name": self.name, "version": self.version, "last_inference": s.last_inference_ms,
                "inference_count": s.inference_count, "execution_count": s.execution_count,
                "inference_stats": {"success": s.success.to_json(), "fail": s.fail.to_json(),
                                    "queue": s.queue.to_json(), "compute_input": s.compute_input.to_json(),
                                    "compute_infer": s.compute_infer.to_json(),
                                    "compute_output": s.compute_output.to_json(),
                                    "cache_hit": zero, "cache_miss": zero},
                "batch_stats": [{"batch_size": size, "compute_input": b.compute_input.to_json(),
                                 "compute_infer": b.compute_infer.to_json(),
                                 "compute_output": b.compute_output.to_json()}
                                for size, b in sorted(s.batches.items())]}

    def _validate(self, inputs: dict[str, np.ndarray], requested: list[str] | None) -> int:
        """BadRequest naming the first wrong input or output; the request's batch size (1 for unbatched)."""
        cfg, expected = self.config, self._input_spec
        if inputs.keys() != expected.keys():
            if unknown := sorted(set(inputs) - set(expected)):
                raise BadRequest(f"unknown input {unknown[0]!r} for model {self.name!r}; its inputs are "
                                 f"{sorted(expected)}")
            missing = sorted(set(expected) - set(inputs))
            raise BadRequest(f"model {self.name!r}: missing input {missing[0]!r}; its inputs are {sorted(expected)}")
        if requested is not None and (bad := [r for r in requested if r not in self._output_names]):
            raise BadRequest(f"unknown output {bad[0]!r} for model {self.name!r}; its outputs are "
                             f"{sorted(self._output_names)}")
        batch = set()
        for name, (want, datatype, dims) in expected.items():
            a = inputs[name]
            if isinstance(a, torch.Tensor):  # a view of a CUDA shared memory region
                if want.kind not in "biuf" or a.dtype != torch_dtype(want):
                    raise BadRequest(f"input {name!r}: datatype {a.dtype} does not match the model's {datatype}")
            elif not isinstance(a, np.ndarray):
                raise BadRequest(f"input {name!r} must be a numpy array, got {type(a).__name__}")
            elif a.dtype != want:
                got = NUMPY_TO_V2.get(a.dtype, str(a.dtype))
                raise BadRequest(f"input {name!r}: datatype {got} does not match the model's {datatype}")
            if a.ndim != len(dims) or any(d != -1 and d != s for d, s in zip(dims, a.shape)):
                raise BadRequest(f"input {name!r}: shape {list(a.shape)} does not match the model's {dims} "
                                 "(-1 = any size)")
            if cfg.max_batch_size:
                batch.add(a.shape[0])
        if len(batch) > 1:
            raise BadRequest(f"model {self.name!r}: inputs have different batch sizes {sorted(batch)}")
        try:
            check_indices(inputs, self._index_bounds)
        except InputError as e:
            raise BadRequest(f"model {self.name!r}: {e}") from None
        rows = batch.pop() if batch else 1
        if cfg.max_batch_size and not 1 <= rows <= cfg.max_batch_size:
            raise BadRequest(f"model {self.name!r}: batch size {rows} must be between 1 and max_batch_size "
                             f"{cfg.max_batch_size}")
        return rows

    def _on_batch(self, rec: BatchRecord) -> None:
        """Record one executed batch in the statistics and metrics."""
        s = self.stats
        s.execution_count += 1
        b = s.batches.get(rec.rows) or s.batches.setdefault(rec.rows, BatchStats())
        b.compute_input.add(rec.input_ns)
        b.compute_infer.add(rec.compute_ns)
        b.compute_output.add(rec.output_ns)
        if rec.ok:
            s.inference_count += rec.rows
        self.metrics.batch(self.name, rec.rows, rec.compute_ns / 1e9, [q / 1e9 for q in rec.queue_ns])

    def _finish(self, start_ns: int, status: str, ok: bool, timing: RequestTiming | None = None) -> None:
        """Count one finished request in the statistics and metrics; a successful one with its stage times."""
        s, total = self.stats, time.perf_counter_ns() - start_ns
        (s.success if ok else s.fail).add(total)
        if ok and timing is not None:
            s.queue.add(timing.queue_ns)
            s.compute_input.add(timing.input_ns)
            s.compute_infer.add(timing.infer_ns)
            s.compute_output.add(timing.output_ns)
            self.metrics.stages(self.name, total / 1e9, timing.input_ns / 1e9, timing.output_ns / 1e9)
        s.last_inference_ms = int(time.time() * 1000)
        self.metrics.request(self.name, self.version, status)
        if _REQUEST_LOG.isEnabledFor(logging.INFO):
            ms = round(total / 1e6, 3)
            _REQUEST_LOG.info(f"{self.name} version {self.version}: {status} in {ms} ms", extra={"fields": {
                "event": "inference", "model": self.name, "version": self.version, "status": status, "ms": ms}})


def _padding_limits(engine, padding) -> list[tuple[int, int]]:
    """(most rows, longest padded length) of each engine profile covering the padded inputs: a padded batch must fit
    one of them. Empty (no limit but max_batch_size) for an engine without profiles."""
    limits = []
    for profile in getattr(getattr(engine, "config", None), "profiles", ()) or ():
        ranges = [r for r in profile.values() if len(r.max) > 0]
        padded = [profile[n] for n in padding.inputs if n in profile and len(profile[n].max) > padding.axis]
        if ranges and padded:
            limits.append((min(r.max[0] for r in ranges), min(r.max[padding.axis] for r in padded)))
    return limits


def _on_gpu(engine) -> bool:
    device = getattr(engine, "device", None)
    return getattr(device, "backend", None) == "cuda"


def _batch_buckets(engine, cfg: ModelConfig) -> list[int]:
    """The row counts batches are padded up to: the config's, or on a GPU the powers of two, the preferred sizes and
    max_batch_size (each new batch shape costs a CUDA graph capture; a few shapes are captured once)."""
    db, top = cfg.dynamic_batching, cfg.max_batch_size or 0
    if db is None or top < 1:
        return []
    if db.batch_buckets is not None:
        return sorted({b for b in db.batch_buckets if b <= top})
    if not _on_gpu(engine):
        return []
    return sorted({1 << i for i in range(top.bit_length()) if 1 << i <= top} | set(db.preferred_batch_size) | {top})


def _length_multiple(engine, padding) -> int:
    """Padded lengths are rounded up to this multiple (1: not rounded); 16 by default on a GPU, for the same reason."""
    if padding is None:
        return 1
    if padding.length_multiple is not None:
        return padding.length_multiple
    return 16 if _on_gpu(engine) else 1

