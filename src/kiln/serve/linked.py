"""A front end's view of the engine process (`kiln serve --frontends N`): `LinkedRepository` serves the protocol
handlers as `ModelRepository` does, but each model's `infer` goes over the link to the engine process, and the
index and statistics are the engine's, refreshed every `STATE_REFRESH_S`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.serve import link
from kiln.serve.config import TensorConfig
from kiln.serve.dtypes import to_v2
from kiln.serve.errors import BadRequest, InferenceFailed, ModelNotReady
from kiln.serve.repository import Entry, ModelRepository
from kiln.serve.shared_memory import SYSTEM, TensorRef, check_size

STATE_REFRESH_S = 0.2
CONNECT_TIMEOUT_S = 24 * 3600.0  # the engine process may build its models first


class Link:
    """One front end's connection to the engine: request ids, the replies' waiters and the shared memory slots."""

    def __init__(self, spec: link.LinkSpec, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.spec, self.reader, self.writer, self.out = spec, reader, writer, link.Outbox(writer)
        self.shm = link.map_fd(spec.fds[0], spec.slots * spec.slot_bytes)
        self.free = list(range(spec.slots))
        self.ids = itertools.count()
        self.waiting: dict[int, tuple[asyncio.Future, int | None]] = {}
        self.gone: str | None = None
        self.reading = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, spec: link.LinkSpec, timeout_s: float = CONNECT_TIMEOUT_S) -> Link:
        """Connect once the engine process listens (it does after loading its models)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(spec.path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise ModelNotReady(f"the engine process did not come up within {timeout_s:.0f} s") from None
                await asyncio.sleep(0.05)
        writer.writelines(link.frame({"op": "hello", "frontend": spec.frontend}))
        return cls(spec, reader, writer)

    async def call(self, header: dict, parts: list = (), slot: int | None = None) -> tuple[dict, Any]:
        """Send a request; (reply header, its tensors or state). Cancelling the caller cancels the engine's work;
        the slot is freed when the reply comes, whoever waits."""
        if self.gone:
            if slot is not None:
                self.free.append(slot)
            raise ModelNotReady(f"the engine process is gone ({self.gone})")
        rid = header["id"] = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = (fut, slot)
        self.out.put(header, parts)
        try:
            return await fut
        except asyncio.CancelledError:
            if not self.gone and not self.writer.is_closing():
                self.out.put({"op": "cancel", "id": rid})
            raise

    async def _read(self) -> None:
        frames = link.FrameReader(self.reader)
        try:
            while True:
                for header, payload in await frames.frames():
                    self._answer(header, payload)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self._fail(f"link closed: {type(e).__name__}")
        except asyncio.CancelledError:
            self._fail("the front end is closing")
            raise

    def _answer(self, header: dict, payload: bytes) -> None:
        fut, slot = self.waiting.pop(header["id"], (None, None))
        try:
            result = header.get("state")
            if "outputs" in header:  # copies: the slot is reused once freed
                result = {k: np.array(v) for k, v in
                          link.read(self.shm if header.get("shm") else payload, header["outputs"]).items()}
                for name, (dtype, shape) in header.get("written", {}).items():  # the engine wrote them
                    result[name] = np.broadcast_to(np.zeros((), dtype), shape)  # their dtype and shape, no bytes
        finally:
            if slot is not None:
                self.free.append(slot)
        if fut is not None and not fut.done():
            fut.set_result((header, result))

    def _fail(self, why: str) -> None:
        self.gone = why
        for fut, slot in self.waiting.values():
            if not fut.done():
                fut.set_exception(InferenceFailed(f"the engine process is gone ({why})"))
            if slot is not None:
                self.free.append(slot)
        self.waiting.clear()

    async def close(self) -> None:
        self.reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.reading
        self.writer.close()
        self.shm.close()


class LinkedConfig:
    """The parts of a model's config a front end reads: its inputs, outputs and Triton config JSON."""

    def __init__(self, raw: dict):
        self.raw = raw
        self.max_batch_size = raw.get("max_batch_size", 0)
        tensors = lambda key: [TensorConfig(t["name"], to_v2(t["data_type"]), list(t["dims"]))  # noqa: E731
                               for t in raw.get(key, [])]
        self.input, self.output = tensors("input"), tensors("output")

    def to_json(self) -> dict:
        return self.raw


class LinkedModel:
    """A READY model of the engine process, as a front end serves it (`ServedModel`'s interface)."""

    def __init__(self, link_: Link, state: dict, metrics=None):
        self.link, self.name, self.version, self.metrics = link_, state["name"], state["version"], metrics
        self.update(state)

    def update(self, state: dict) -> None:
        self.config, self._metadata = LinkedConfig(state["config"]), state["metadata"]
        self.versions, self._statistics = state["metadata"].get("versions", [self.version]), state["statistics"]

    def metadata(self) -> dict:
        return self._metadata

    def statistics(self) -> dict:
        return self._statistics

    async def infer(self, inputs: dict[str, np.ndarray], requested: list[str] | None = None,
                    timeout_s: float | None = None, *, start_ns: int | None = None, decode_ns: int = 0,
                    encode: Callable[[dict[str, np.ndarray]], Any] | None = None,
                    shm_outputs: dict[str, TensorRef] | None = None) -> Any:
        """Send one request to the engine process; its outputs (or `encode(outputs)`), or its ServeError. Inputs in
        shared memory (`RegionInput`s) go as references, and the engine writes `shm_outputs` into their regions."""
        begin = time.perf_counter_ns()
        spec, lk = self.link.spec, self.link
        header = {"op": "infer", "model": self.name, "version": self.version, "requested": requested,
                  "timeout": timeout_s, "decode_ns": decode_ns,
                  "pre_ns": begin - start_ns if start_ns is not None else 0}
        if any(isinstance(v, RegionInput) for v in inputs.values()):
            header["regions"] = [[k, *v.header()] for k, v in inputs.items() if isinstance(v, RegionInput)]
            inputs = {k: v for k, v in inputs.items() if not isinstance(v, RegionInput)}
        if shm_outputs:
            header["shm_outputs"] = {k: [r.region, r.offset, r.byte_size] for k, r in shm_outputs.items()}
        slot = lk.free.pop() if lk.free else None
        parts: list = []
        if slot is not None:
            base = slot * spec.slot_bytes
            entries, end = link.describe(inputs, base)
            if end <= base + spec.slot_bytes:
                link.write(lk.shm, entries, inputs)
                header.update(slot=slot, end=end)
            else:
                lk.free.append(slot)
                slot = None
        if slot is None:
            entries, _ = link.describe(inputs, 0)
            parts = link.inline(entries, inputs, 0)
        header["inputs"] = entries
        reply, outputs = await lk.call(header, parts, slot)
        linked = time.perf_counter_ns()
        if "error" in reply:
            link.raise_error(reply)
        result = encode(outputs) if encode is not None else outputs
        if self.metrics is not None:
            self.metrics.frontend(self.name, (time.perf_counter_ns() - (begin if start_ns is None else start_ns)) / 1e9,
                                  (linked - begin) / 1e9)
        return result


@dataclass(frozen=True)
class RegionInput:
    """An input in a shared memory region, as a front end parsed it: the engine process reads it there."""

    ref: TensorRef
    datatype: str
    dtype: np.dtype
    shape: list[int]

    def header(self) -> list:
        return [self.ref.region, self.ref.offset, self.ref.byte_size, self.datatype, self.dtype.str, self.shape]


class LinkedRegions:
    """A front end's shared memory registry: the regions are the engine process's (one set for every front end, as a
    client's calls may reach any of them). Registration and status go over the link; an input in a region is a
    `RegionInput` the engine reads, and outputs bound for regions are written there by the engine."""

    def __init__(self, repo: LinkedRepository, cuda: bool):
        self.repo = repo
        self.extensions = ["system_shared_memory"] + (["cuda_shared_memory"] if cuda else [])

    async def _call(self, call: str, *args) -> Any:
        reply, _ = await self.repo.link.call({"op": "regions", "call": call, "args": list(args)})
        if "error" in reply:
            link.raise_error(reply)
        return reply.get("result")

    async def register(self, name, key, offset, byte_size) -> None:
        await self._call("register", name, key, offset, byte_size)

    async def register_cuda(self, name, raw_handle, device_id, byte_size) -> None:
        if not isinstance(raw_handle, (bytes, bytearray)):
            raise BadRequest(f"CUDA shared memory region {name!r}: raw_handle must be the handle's bytes")
        await self._call("register_cuda", name, base64.b64encode(raw_handle).decode(), device_id, byte_size)

    async def unregister(self, name: str = "", kind: str = SYSTEM) -> None:
        await self._call("unregister", name, kind)

    async def status(self, name: str = "", kind: str = SYSTEM) -> list[dict]:
        return await self._call("status", name, kind)

    def check(self, what: str, ref: TensorRef) -> None:
        """Nothing here: the engine process checks `ref` when it writes the output."""

    def read(self, what: str, ref: TensorRef, datatype: str, dtype, shape: list[int]) -> RegionInput:
        return RegionInput(ref, datatype, check_size(what, ref, datatype, dtype, shape), list(shape))

    def write(self, what: str, ref: TensorRef, array: np.ndarray) -> None:
        """Nothing here: the engine process wrote the output into its region."""

    def close(self) -> None:
        """Nothing here: the engine process owns the regions."""


class LinkedRepository(ModelRepository):
    """The engine process's repository seen from a front end: `get`, `models` and `index` as `ModelRepository`
    answers them (same messages), from the engine's state; load and unload are off."""

    def __init__(self, root, spec: link.LinkSpec, *, metrics=None):
        super().__init__(root, metrics=metrics,
                         control="the models are loaded by kiln serve's engine process (--frontends); serve with "
                                 "--workers 1 and no --frontends to load and unload")
        self.spec, self.link = spec, None
        self._refresh: asyncio.Task | None = None

    async def start(self, load_all: bool = True) -> None:
        self.link = await Link.connect(self.spec)
        await self._pull()
        self._refresh = asyncio.create_task(self._refresh_loop())
        self._started = True

    async def _pull(self) -> None:
        _, state = await self.link.call({"op": "state"})
        with self._lock:
            old = {(e.name, e.version): e.model for es in self._entries.values() for e in es.values() if e.model}
        served = {(m["name"], m["version"]): m for m in state["models"]}
        entries: dict[str, dict[str, Entry]] = {}
        for e in state["index"]:
            key, model = (e["name"], e["version"]), None
            if key in served:
                model = old.get(key)
                if model is None:
                    model = LinkedModel(self.link, served[key], self.metrics)
                else:
                    model.update(served[key])
            entries.setdefault(e["name"], {})[e["version"]] = Entry(e["name"], e["version"], e["state"],
                                                                    e["reason"] or "unloaded", model)
        with self._lock:
            self._entries = entries

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(STATE_REFRESH_S)
            with contextlib.suppress(ModelNotReady, InferenceFailed):
                await self._pull()

    async def close(self) -> None:
        self._closing = True
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
        if self.link is not None:
            await self.link.close()
