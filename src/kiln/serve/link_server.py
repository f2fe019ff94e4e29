"""The engine process's end of the link (`kiln serve --frontends N`): it answers the front ends' infer, cancel and
state requests from its own `ModelRepository`, so every front end's requests meet in one batcher per model."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time

from kiln.serve import link
from kiln.serve.errors import ClientGone, InferenceFailed, ServeError
from kiln.serve.logs import event
from kiln.serve.shared_memory import SharedMemoryRegistry, TensorRef, off_error

WRITE_HIGH_WATER = 1 << 20  # bytes buffered towards a front end before a reply waits for the socket


class LinkServer:
    """Serves `repo` to the front ends on `spec.path`, and the shared memory `regions` (None: off) they register;
    `start()`, then `close()` after the repository drained."""

    def __init__(self, repo, spec: link.LinkSpec, regions: SharedMemoryRegistry | None = None):
        self.repo, self.spec, self.regions = repo, spec, regions
        size = spec.slots * spec.slot_bytes
        self.maps = [link.map_fd(fd, size) for fd in spec.fds]
        self.server: asyncio.AbstractServer | None = None
        self.clients: set[asyncio.Task] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._client, self.spec.path)
        os.chmod(self.spec.path, 0o600)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self.clients):
            t.cancel()
        await asyncio.gather(*self.clients, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spec.path)

    def state(self) -> dict:
        """What a front end serves from: the index and every READY model's config, metadata and statistics."""
        return {"index": self.repo.index(),
                "models": [{"name": m.name, "version": m.version, "config": m.config.to_json(),
                            "metadata": m.metadata(), "statistics": m.statistics()} for m in self.repo.models()]}

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.add(asyncio.current_task())
        pending: dict[int, asyncio.Task] = {}
        frames, out = link.FrameReader(reader), link.Outbox(writer)
        shm = None
        try:
            while True:
                for header, payload in await frames.frames():
                    op, rid = header["op"], header.get("id")
                    if op == "infer":
                        task = pending[rid] = asyncio.create_task(self._infer(header, payload, shm, out))
                        task.add_done_callback(lambda _t, rid=rid: pending.pop(rid, None))
                    elif op == "cancel":
                        if rid in pending:
                            pending[rid].cancel()
                    elif op == "state":
                        out.put({"id": rid, "state": self.state()})
                    elif op == "regions":
                        out.put(self._regions(header))
                    elif op == "hello":
                        shm = self.maps[header["frontend"]]
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front end stopped
        except asyncio.CancelledError:
            pass
        finally:
            for t in pending.values():
                t.cancel()
            writer.close()
            self.clients.discard(asyncio.current_task())

    def _shared(self) -> SharedMemoryRegistry:
        if self.regions is None:
            raise off_error()
        return self.regions

    def _regions(self, h: dict) -> dict:
        """A front end's registration, unregistration or status call on the regions: its reply header."""
        call, args = h["call"], h["args"]
        try:
            if call == "register_cuda":
                name, b64, device_id, size = args
                args = [name, base64.b64decode(b64), device_id, size]
            if call not in ("register", "register_cuda", "unregister", "status"):
                raise InferenceFailed(f"link: unknown regions call {call!r}")
            return {"id": h["id"], "result": getattr(self._shared(), call)(*args)}
        except ServeError as e:
            return link.error_header(h["id"], e)

    async def _infer(self, h: dict, payload: bytes, shm, out: link.Outbox) -> None:
        """Run one request and write its one reply (outputs, or the error), whatever happens."""
        rid, slot = h["id"], h.get("slot")
        base = slot * self.spec.slot_bytes if slot is not None else 0
        try:
            model = self.repo.get(h["model"], h.get("version"))
            inputs = link.read(shm if slot is not None else payload, h["inputs"])
            for name, region, offset, size, datatype, dtype, shape in h.get("regions", ()):
                inputs[name] = self._shared().read(f"input '{name}'", TensorRef(region, offset, size), datatype, dtype,
                                                   shape)
            outputs = await model.infer(inputs, h.get("requested"), h.get("timeout"),
                                        start_ns=time.perf_counter_ns() - h.get("pre_ns", 0),
                                        decode_ns=h.get("decode_ns", 0))
            written = {}
            for name, (region, offset, size) in (h.get("shm_outputs") or {}).items():
                array = outputs.pop(name)
                self._shared().write(f"output '{name}'", TensorRef(region, offset, size), array)
                written[name] = [array.dtype.str, list(array.shape)]
            if slot is not None:
                entries, end = link.describe(outputs, h["end"])
                if end <= base + self.spec.slot_bytes:
                    link.write(shm, entries, outputs)
                    return out.put({"id": rid, "outputs": entries, "shm": True, "written": written})
            entries, _ = link.describe(outputs, 0)
            out.put({"id": rid, "outputs": entries, "written": written}, link.inline(entries, outputs, 0))
        except ServeError as e:
            out.put(link.error_header(rid, e))
        except asyncio.CancelledError:
            out.put(link.error_header(rid, ClientGone("the request was cancelled")))
        except Exception as e:  # noqa: BLE001 - a bug of ours still answers the request
            event(f"link: request {rid} failed: {type(e).__name__}: {e}", event="link_error")
            out.put(link.error_header(rid, InferenceFailed(f"{type(e).__name__}: {e}")))
        if out.writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            with contextlib.suppress(ConnectionError):
                await out.writer.drain()
