"""The dynamic batcher: queues requests, merges those of equal non-batch dims (or, with a padding config, of dims
that differ only along the padded axis), runs them on worker threads."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from kiln.errors import KilnError
from kiln.runtime.cuda_graph import DEFAULT_MAX_GRAPHS as DEFAULT_GRAPHS
from kiln.runtime.io import as_torch, upload
from kiln.serve.errors import BadRequest, InferenceFailed, ModelNotReady, QueueFull, RequestTimeout, ServeError
from kiln.serve.staging import Staging, gather, stageable


MAX_GRAPHS = 256  # CUDA graphs an execution context keeps at most: one per batch bucket and padded length


@dataclass
class BatchRecord:
    """What one executed batch reports: rows, request count, engine time, each request's queue wait, success, and
    the time to assemble its inputs (concatenation, padding) and split its outputs."""

    rows: int
    requests: int
    compute_ns: int
    queue_ns: list[int]
    ok: bool
    input_ns: int = 0
    output_ns: int = 0


@dataclass(slots=True)
class RequestTiming:
    """One request's nanoseconds by Triton's stages; the batcher adds its batch's share when the batch is done."""

    queue_ns: int = 0
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


@dataclass(eq=False)
class Request:
    """One queued request: its inputs, row count (batch dim), merge key, the future that answers it and, with
    padding, its length along the padded axis."""

    inputs: dict[str, np.ndarray | torch.Tensor] = field(repr=False)  # a repr would print every array (MBs)
    rows: int
    key: tuple
    future: asyncio.Future = field(repr=False)
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)
    timer: asyncio.TimerHandle | None = None
    length: int | None = None
    timing: RequestTiming | None = None
    outputs: frozenset[str] | None = None  # the outputs it asked for (None: all)


@dataclass(eq=False)
class _LoopState:
    """The queue and worker tasks of the event loop the batcher serves (rebuilt if another loop calls)."""

    loop: asyncio.AbstractEventLoop
    pending: deque = field(default_factory=deque)
    workers: list = field(default_factory=list)
    waiters: list = field(default_factory=list)  # one future per idle worker, resolved by wake()

    def wake(self) -> None:
        """Wake every waiting worker: a request arrived, or the batcher closes."""
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(False)

    async def sleep(self, timeout_s: float | None = None) -> bool:
        """Wait for `wake()` or `timeout_s`; True when the time ran out. Below the loop's timer resolution (1 ms)
        the timer may fire at once (uvloop): the caller then stops waiting rather than wait again and spin."""
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        timer = None if timeout_s is None else self.loop.call_later(timeout_s, _time_out, waiter)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(True)


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    """On the loop: answer `future` with a worker thread's result or error, unless it was cancelled."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Threads:
    """`count` daemon threads that run calls for an event loop: one queue put there and one call_soon_threadsafe
    back, about half the cost of run_in_executor (no concurrent Future, no wrap_future chain)."""

    def __init__(self, count: int, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True) for i in range(count)]
        for t in self._threads:
            t.start()

    def run(self, loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> asyncio.Future:
        """A future of `loop` that gets `fn(*args)`, called on one of the threads (or its exception)."""
        future = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Let each thread exit once the calls queued before are done."""
        for _ in self._threads:
            self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            loop, future, fn, args = call
            try:
                result, error = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, e
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: no one awaits the answer
                pass


@dataclass(eq=False)
class DynamicBatcher:
    """Merges queued requests up to `max_batch_size` rows (0: never merges) and runs them on `instance_count`
    execution contexts, each used by one engine call at a time on a worker thread.

    `padding` (a config.Padding: axis, inputs → pad value, outputs) also merges requests whose listed inputs differ
    only along `axis`: each is right-padded to the batch's longest, and the listed outputs are sliced back to each
    request's own length. `padding_limits`: the (rows, padded length) boxes the engine's profiles admit; a batch is
    only grown while it fits one of them (none given: max_batch_size alone bounds it).

    `batch_buckets`: a batch's rows are padded (repeating its last row) up to the smallest bucket that holds them,
    and padded lengths are rounded up to `length_multiple`, so that the engine meets few shapes; the pad rows and
    positions are dropped from the answers.

    `inline_s`: a lone request runs on the event loop itself, skipping the two thread hand-offs (0.1-0.2 ms), when
    nothing else is queued or running and its shape's last lone run took at most this long and less than the mean
    time between requests (so under load, when more would arrive meanwhile, the loop keeps taking them in); 0: never.
    A shape's first run always goes to a worker thread, so a compile or a slow engine never holds the loop."""

    engine: object
    max_batch_size: int = 0
    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_s: float = 0.0
    max_queue_size: int = 0
    reject_status: int = 503
    instance_count: int = 1
    on_batch: Callable[[BatchRecord], None] | None = None
    name: str = "model"
    padding: object | None = None
    padding_limits: list[tuple[int, int]] = field(default_factory=list)
    batch_buckets: list[int] = field(default_factory=list)
    length_multiple: int = 1
    inline_s: float = 0.0

    def __post_init__(self):
        self._on_cuda = getattr(getattr(self.engine, "device", None), "backend", None) == "cuda"
        self._contexts: queue.SimpleQueue = queue.SimpleQueue()
        longest = max((n for _, n in self.padding_limits), default=1)
        graphs = min(MAX_GRAPHS, max(DEFAULT_GRAPHS, len(self.batch_buckets) * -(-longest // self.length_multiple)))
        self._staging: dict[int, Staging] = {}  # id(context) → its pinned input block (CUDA engines)
        for _ in range(self.instance_count):
            ctx = self.engine.create_context(max_cuda_graphs=graphs)
            self._contexts.put(ctx)
            if self._on_cuda:
                self._staging[id(ctx)] = Staging(pinned=True)
        self._threads = _Threads(self.instance_count, f"kiln-serve-{self.name}")
        self._state: _LoopState | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._running = 0  # batches on worker threads now
        self._lone_ns: dict[tuple, int] = {}  # (merge key, padded length, bucket) → its last lone run's ns
        self._arrived_ns = 0  # when the last request was queued
        self._gap_ns = 0.0  # the mean time between requests (moving average)

    @property
    def queued(self) -> int:
        """Requests waiting in the queue now."""
        return 0 if self._state is None else len(self._state.pending)

    async def submit(self, inputs: dict[str, np.ndarray], rows: int, timeout_s: float | None = None,
                     timing: RequestTiming | None = None, outputs: frozenset[str] | None = None) -> dict:
        """Queue one request (inputs already validated) and wait for exactly its rows of every output (of `outputs`
        at least, where given: a batch copies to the host only the outputs some request in it asked for); `timing`
        gets its queue wait and its batch's input assembly, engine and output split times."""
        if self._closed:
            raise ModelNotReady(f"model {self.name!r} is unloading; no new requests are accepted")
        state = self._bind()
        if self.max_queue_size and len(state.pending) >= self.max_queue_size:
            raise QueueFull(f"model {self.name!r}: the queue is full ({self.max_queue_size} requests waiting); "
                            "retry later", http_status=self.reject_status)
        key, length = self._key(inputs)
        req = Request(inputs, rows, key, state.loop.create_future(), length=length, timing=timing, outputs=outputs)
        self._gap_ns += (req.enqueued_ns - self._arrived_ns - self._gap_ns) / 8
        self._arrived_ns = req.enqueued_ns
        if timeout_s:
            req.timer = state.loop.call_later(timeout_s, self._expire, state, req, timeout_s)
        req.future.add_done_callback(lambda _f: self._forget(state, req))
        state.pending.append(req)
        state.wake()
        return await req.future

    async def close(self) -> None:
        """Stop accepting requests, finish every queued one, then stop the workers and their threads."""
        self._closed = True
        state = self._state
        if state is not None and state.loop is asyncio.get_running_loop():
            state.wake()
            await asyncio.gather(*state.workers, return_exceptions=True)
        self._threads.shutdown()

    def close_soon(self) -> asyncio.Future | None:
        """Start `close()` from sync code: on the batcher's loop if it runs, else at once (nothing can be queued)."""
        self._closed = True
        state = self._state
        if state is None or state.loop.is_closed() or not state.loop.is_running():
            self._threads.shutdown()
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is state.loop:
            return asyncio.ensure_future(self.close())
        closing = asyncio.run_coroutine_threadsafe(self.close(), state.loop)  # from another thread (a load in a worker)
        return asyncio.wrap_future(closing) if running else None

    def _key(self, inputs: dict[str, np.ndarray]) -> tuple[tuple, int | None]:
        """(merge key, length along the padded axis): requests with equal keys may share a batch."""
        pad = self.padding if self.max_batch_size else None
        if pad is None:
            return tuple(sorted((k, _dtype_key(v), v.shape[1:] if self.max_batch_size else v.shape)
                                for k, v in inputs.items())), None
        key, lengths = [], set()
        for k, v in inputs.items():
            dims = v.shape[1:]
            if k in pad.inputs and v.ndim > pad.axis:
                lengths.add(v.shape[pad.axis])
                dims = (*v.shape[1:pad.axis], -1, *v.shape[pad.axis + 1:])
            key.append((k, _dtype_key(v), dims))
        if len(lengths) > 1:
            raise BadRequest(f"model {self.name!r}: the padded inputs {sorted(pad.inputs)} have different lengths "
                             f"{sorted(lengths)} along axis {pad.axis}; they must agree")
        return tuple(sorted(key)), (lengths.pop() if lengths else None)

    def _fits(self, rows: int, length: int | None) -> bool:
        """Whether a padded batch of `rows` rows and `length` along the padded axis fits one engine profile."""
        if length is None or not self.padding_limits:
            return True
        return any(rows <= r and length <= n for r, n in self.padding_limits)

    def _bind(self) -> _LoopState:
        """The state for the running loop, with `instance_count` workers started on first use."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._state is None or self._state.loop is not loop:
                self._state = _LoopState(loop)
                self._state.workers = [loop.create_task(self._worker(self._state), name=f"kiln-batcher-{self.name}")
                                       for _ in range(self.instance_count)]
            return self._state

    def _expire(self, state: _LoopState, req: Request, timeout_s: float) -> None:
        """Answer a request still queued at its deadline with RequestTimeout."""
        if not req.future.done() and req in state.pending:
            req.future.set_exception(RequestTimeout(
                f"model {self.name!r}: the request waited {timeout_s * 1e3:.0f} ms in the queue without running"))

    @staticmethod
    def _forget(state: _LoopState, req: Request) -> None:
        """Drop a finished (answered, timed-out or cancelled) request from the queue."""
        if req.timer is not None:
            req.timer.cancel()
        if req in state.pending:  # usually a batch took it already (deque.remove would format a ValueError)
            state.pending.remove(req)

    async def _worker(self, state: _LoopState) -> None:
        """Form batches and run them until the batcher closes and its queue is empty."""
        while True:
            while not state.pending and not self._closed:
                await state.sleep()
            if not state.pending:
                return
            batch = await self._form(state)
            if batch:
                await self._run(state, batch)

    async def _form(self, state: _LoopState) -> list[Request]:
        """Take the next batch: the oldest request and compatible ones, waiting up to max_queue_delay for more."""
        expired = None  # the head whose wait ran out (its deadline by the loop's timer)
        while state.pending:
            head = state.pending[0]
            group = self._compatible(state, head)
            rows = sum(r.rows for r in group)
            full = rows >= self.max_batch_size or (self.preferred_batch_size and rows >= max(self.preferred_batch_size))
            left = head.enqueued_ns / 1e9 + self.max_queue_delay_s - time.perf_counter_ns() / 1e9
            if self.max_batch_size == 0 or full or left <= 0 or self._closed or head is expired:
                group = self._preferred(group)
                for r in group:
                    state.pending.remove(r)
                return group
            expired = head if await state.sleep(left) else None
        return []

    def _compatible(self, state: _LoopState, head: Request) -> list[Request]:
        """The head and, in arrival order, queued requests with its key that fit within max_batch_size."""
        if self.max_batch_size == 0:
            return [head]
        group, rows, length = [head], head.rows, head.length
        for r in state.pending:
            if r is head or r.key != head.key or rows + r.rows > self.max_batch_size:
                continue
            longest = length if r.length is None else max(length, r.length)
            if not self._fits(rows + r.rows, longest):
                continue  # padding this one in would leave every profile: a later batch takes it
            group.append(r)
            rows, length = rows + r.rows, longest
        return group

    def _preferred(self, group: list[Request]) -> list[Request]:
        """The longest arrival-order prefix of `group` whose rows are a preferred size (all of it if none is)."""
        if not self.preferred_batch_size:
            return group
        rows, best = 0, None
        for i, r in enumerate(group):
            rows += r.rows
            if rows in self.preferred_batch_size:
                best = i + 1
        return group if best is None else group[:best]

    async def _run(self, state: _LoopState, batch: list[Request]) -> None:
        """Run one batch on a worker thread and answer each request with its own rows (or the batch's error)."""
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        start = time.perf_counter_ns()
        queue_ns = [start - r.enqueued_ns for r in live]
        input_ns = infer_ns = 0
        try:
            rows = sum(r.rows for r in live)
            padded = self._padded_length(live, rows)
            bucket = self._bucket(rows, padded)
            lone = (live[0].key, padded, bucket) if len(live) == 1 else None
            if lone is not None and self._inline(state, lone):
                answers, input_ns, infer_ns, output_ns = self._execute(live, padded, bucket)
            else:
                self._running += 1
                try:
                    answers, input_ns, infer_ns, output_ns = await self._threads.run(state.loop, self._execute, live,
                                                                                     padded, bucket)
                finally:
                    self._running -= 1
            if lone is not None:
                if len(self._lone_ns) >= MAX_GRAPHS:
                    self._lone_ns.clear()
                self._lone_ns[lone] = input_ns + infer_ns + output_ns
        except Exception as e:  # every request of the batch gets exactly one answer
            self._report(BatchRecord(sum(r.rows for r in live), len(live), infer_ns, queue_ns, False, input_ns))
            err = e if isinstance(e, ServeError) else _engine_error(self.name, e)
            for r in live:
                if not r.future.done():
                    r.future.set_exception(err)
            return
        self._report(BatchRecord(rows, len(live), infer_ns, queue_ns, True, input_ns, output_ns))
        for r, waited, answer in zip(live, queue_ns, answers):
            if (t := r.timing) is not None:
                t.queue_ns, t.infer_ns = waited, infer_ns
                t.input_ns += input_ns
                t.output_ns += output_ns
            if not r.future.done():
                r.future.set_result(answer)

    def _inline(self, state: _LoopState, lone: tuple) -> bool:
        """Whether the lone request of shape `lone` runs on the event loop (see `inline_s`)."""
        if not self.inline_s or state.pending or self._running:
            return False
        last = self._lone_ns.get(lone)
        return last is not None and last <= min(self.inline_s * 1e9, self._gap_ns)

    def run_each_context(self, feeds: dict) -> None:
        """Run `feeds` on every execution context (a warm-up, before any request is queued): twice where a dynamic
        engine captures CUDA graphs, as it records a new shape at its first run and captures it at the second."""
        contexts = [self._contexts.get() for _ in range(self.instance_count)]
        try:
            for ctx in contexts:
                for _ in range(2 if ctx.graphs is not None and ctx.engine.shape_program else 1):
                    ctx.run(feeds)
        finally:
            for ctx in contexts:
                self._contexts.put(ctx)

    def _assemble(self, live: list[Request], padded: int | None, bucket: int,
                  staging: Staging | None) -> dict[str, np.ndarray | torch.Tensor]:
        """The batch's feeds: each request's inputs copied into its rows (right-padded to `padded`), then the last row
        repeated up to `bucket` rows; in `staging`'s block where given (numeric inputs), else in new arrays. Inputs
        that are tensors (views of CUDA shared memory) are batched in new tensors on their device, or go as they are
        when there is nothing to merge or pad."""
        first = live[0].inputs
        rows = sum(r.rows for r in live)
        device = {k for k, v in first.items() if isinstance(v, torch.Tensor)}
        if not all(stageable(v.dtype) for k, v in first.items() if k not in device):
            staging = None
        alone = len(live) == 1 and (not self.max_batch_size or bucket == rows and padded is None)
        if alone and staging is None:
            return {k: v if k in device else _writable(v) for k, v in first.items()}  # nothing to merge or pad
        specs = {k: (self._batch_shape(k, v, padded, bucket), v.dtype) for k, v in first.items()}
        host = {k: spec for k, spec in specs.items() if k not in device}
        feeds = staging.arrays(host) if staging else {k: np.empty(s, d) for k, (s, d) in host.items()}
        for k in device:
            feeds[k] = first[k] if alone else torch.empty(specs[k][0], dtype=specs[k][1], device=first[k].device)
        for k, dest in feeds.items():
            if k in device and alone:
                continue  # the request's own view
            if not self.max_batch_size:
                dest[...] = first[k]
                continue
            if padded is None and k in device:
                torch.cat([r.inputs[k] for r in live], out=dest[:rows])
            elif padded is None:
                gather([r.inputs[k] for r in live], dest)
            else:
                at = 0
                for r in live:
                    self._copy_rows(k, r.inputs[k], dest[at:at + r.rows])
                    at += r.rows
            if bucket > rows:
                dest[rows:] = dest[rows - 1]
        return feeds

    def _batch_shape(self, name: str, array: np.ndarray, padded: int | None, bucket: int) -> tuple[int, ...]:
        """Input `name`'s shape in a batch of `bucket` rows padded to `padded` (the request's own without batching)."""
        if not self.max_batch_size:
            return array.shape
        shape = [bucket, *array.shape[1:]]
        if padded is not None and name in self.padding.inputs:
            shape[self.padding.axis] = padded
        return tuple(shape)

    def _copy_rows(self, name: str, src: np.ndarray, dest: np.ndarray) -> None:
        """Copy one request's `src` into its rows `dest`, the positions past its length along the padding axis set to
        input `name`'s pad value."""
        if src.shape != dest.shape:
            axis = self.padding.axis
            dest[...] = self.padding.inputs[name]
            dest = dest[(slice(None),) * axis + (slice(0, src.shape[axis]),)]
        dest[...] = src

    def _execute(self, live: list[Request], padded: int | None, bucket: int) -> tuple[list[dict], int, int, int]:
        """On a worker thread (off the event loop, which keeps taking requests in; a lone request may run on the loop,
        see `inline_s`): take a free execution context, assemble the batch in its staging block, run the engine and
        split the outputs; (each request's answer, ns assembling, ns running, ns splitting)."""
        start = time.perf_counter_ns()
        ctx = self._contexts.get()
        try:
            feeds = self._assemble(live, padded, bucket, self._staging.get(id(ctx)))
            wanted = None if any(r.outputs is None for r in live) else frozenset().union(*(r.outputs for r in live))
            ran = time.perf_counter_ns()
            outputs = (_run_on_device if self._on_cuda else _run_on_host)(ctx, feeds, wanted)
        finally:
            self._contexts.put(ctx)
        done = time.perf_counter_ns()
        answers = self._split(live, outputs, bucket, padded) if self.max_batch_size else [outputs]
        return answers, ran - start, done - ran, time.perf_counter_ns() - done

    def _padded_length(self, live: list[Request], rows: int) -> int | None:
        """The length the batch's padded inputs are padded to: the longest, rounded up to `length_multiple` where
        the profiles admit it; None when no request needs padding."""
        lengths = {r.length for r in live if r.length is not None}
        if not lengths:
            return None
        longest = max(lengths)
        rounded = -(-longest // self.length_multiple) * self.length_multiple
        if rounded != longest and self._fits(rows, rounded):
            return rounded
        return longest if len(lengths) > 1 else None

    def _bucket(self, rows: int, length: int | None) -> int:
        """The smallest batch bucket that holds `rows` and fits a profile at `length`; `rows` if none does."""
        return next((b for b in self.batch_buckets if b >= rows and self._fits(b, length)), rows)

    def _split(self, live: list[Request], outputs: dict, rows: int, padded: int | None = None) -> list[dict]:
        """Each request's rows of every output (`rows`: the batch's, pad rows included, which no one gets); after
        padding, the padding outputs cut back to its own length."""
        for k, v in outputs.items():
            if np.ndim(v) == 0 or v.shape[0] != rows:
                raise InferenceFailed(f"model {self.name!r}: output {k!r} of shape {np.shape(v)} has no batch dim of "
                                      f"{rows}; set max_batch_size = 0 for this model")
        cut = set(self.padding.outputs) & set(outputs) if padded is not None else set()
        axis = self.padding.axis if cut else 0
        for k in cut:
            if outputs[k].ndim <= axis or outputs[k].shape[axis] != padded:
                raise InferenceFailed(f"model {self.name!r}: output {k!r} of shape {list(outputs[k].shape)} does not "
                                      f"follow the padded length {padded} along axis {axis}; remove it from "
                                      "[dynamic_batching.padding] outputs")
        answers, at = [], 0
        for r in live:
            answer = {}
            for k, v in outputs.items():
                part = v[at:at + r.rows]
                if k in cut:
                    part = part[(slice(None),) * axis + (slice(0, r.length),)]
                answer[k] = np.ascontiguousarray(part)
            answers.append(answer)
            at += r.rows
        return answers

    def _report(self, record: BatchRecord) -> None:
        if self.on_batch is not None:
            self.on_batch(record)


def _only(outputs: dict, wanted: frozenset[str] | None) -> dict:
    """The `wanted` outputs (all where None)."""
    return outputs if wanted is None else {k: v for k, v in outputs.items() if k in wanted}


def _run_on_device(ctx, feeds: dict, wanted: frozenset[str] | None = None) -> dict:
    """numpy feeds uploaded here and the `wanted` outputs (None: all) downloaded here, so that a batch shape met
    before takes the context's replay fast path (no checks again); device tensors (CUDA shared memory) go in as they
    are; string and other non-numeric feeds go the checked way. Upload, replay and download run on the context's
    own stream (the fast path replays on the current one), so that instances on other threads overlap."""
    if not all(isinstance(v, torch.Tensor) or isinstance(v, np.ndarray) and v.dtype.kind in "biuf"
               for v in feeds.values()):
        return _only(ctx.run(feeds), wanted)
    device = ctx.engine.device.torch_device
    with torch.cuda.stream(ctx.stream):
        return ctx.download(_only(ctx.run({k: v if isinstance(v, torch.Tensor) else upload(as_torch(k, v)[0], device)
                                           for k, v in feeds.items()}), wanted))


def _run_on_host(ctx, feeds: dict, wanted: frozenset[str] | None = None) -> dict:
    """A CPU engine's `wanted` outputs (None: all) as numpy arrays (it answers tensor feeds with tensors)."""
    outputs = _only(ctx.run(feeds), wanted)
    return ctx.download(outputs) if any(isinstance(v, torch.Tensor) for v in feeds.values()) else outputs


def _dtype_key(value: np.ndarray | torch.Tensor) -> str:
    """An input's dtype (and, for a tensor, device) in a merge key: host arrays and device tensors never merge."""
    return value.dtype.str if isinstance(value, np.ndarray) else f"{value.dtype}@{value.device}"


def _writable(array: np.ndarray) -> np.ndarray:
    """`array`, or a copy of it when it is read-only (a view of a request's bytes): the engine gets arrays it owns."""
    return array if array.flags.writeable else array.copy()


def _engine_error(model: str, e: Exception) -> ServeError:
    """A ServeError for an engine failure: the caller's inputs (KilnError) → BadRequest, else InferenceFailed."""
    if isinstance(e, KilnError):
        return BadRequest(f"model {model!r}: {e}")
    return InferenceFailed(f"model {model!r}: inference failed: {type(e).__name__}: {e}")
