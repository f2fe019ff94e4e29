"""The link between `kiln serve --frontends N`'s front-end processes and its one engine process.

Frames over a Unix socket: a 12-byte prefix (header and payload lengths), a JSON header, raw payload bytes. A request's
tensors travel in the front end's slot of a shared memory file (a memfd the supervisor made and handed to both
processes) when they fit one slot, else inline in the payload; the engine writes the outputs after the inputs in the
same slot when they fit, else inline. Tensors are described as [name, numpy dtype str, shape, byte offset]."""

from __future__ import annotations

import asyncio
import json
import math
import mmap
import struct
from dataclasses import dataclass

import numpy as np

from kiln.serve.errors import ServeError

PREFIX = struct.Struct("<IQ")  # header bytes, payload bytes
ALIGN = 64
DEFAULT_SLOTS = 64  # requests in flight per front end through shared memory (more go inline)
DEFAULT_SLOT_BYTES = 4 << 20  # a ResNet-50 fp32 request is 0.6 MB, a BERT-base output 0.4 MB
ERRORS: dict[str, type[ServeError]] = {c.__name__: c for c in ServeError.__subclasses__()}


@dataclass(frozen=True)
class LinkSpec:
    """Where the link is (`path`, the engine's Unix socket) and each front end's shared memory file: `fds[i]` is
    front end i's memfd in this process, `slots` × `slot_bytes` long. `frontend`: this front end's index (None: the
    engine)."""

    path: str
    fds: tuple[int, ...]
    slots: int = DEFAULT_SLOTS
    slot_bytes: int = DEFAULT_SLOT_BYTES
    frontend: int | None = None


def memfd(name: str, size: int) -> int:
    """A shared memory file of `size` bytes (pages are allocated as they are first written), inheritable; Linux."""
    import os

    from kiln.errors import ConfigError

    if not hasattr(os, "memfd_create"):
        raise ConfigError("kiln serve --frontends needs Linux (memfd_create); serve with --workers N here")
    fd = os.memfd_create(name, 0)
    os.ftruncate(fd, size)
    return fd


def map_fd(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def frame(header: dict, parts: list = ()) -> list:
    """The buffers of one frame: prefix, header and `parts` (bytes or contiguous numpy arrays)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    views = [memoryview(p).cast("B") if isinstance(p, np.ndarray) else p for p in parts if len(p)]
    return [PREFIX.pack(len(head), sum(len(v) for v in views)), head, *views]


class FrameReader:
    """Reads the frames from a stream in bulk: one read takes in every frame that has arrived."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader, self.buf = reader, bytearray()

    async def frames(self) -> list[tuple[dict, bytes]]:
        """Every whole frame received so far, (header, payload) each (waits for one); IncompleteReadError when the
        other side closed."""
        while True:
            out, at, buf = [], 0, self.buf
            while len(buf) - at >= PREFIX.size:
                hlen, plen = PREFIX.unpack_from(buf, at)
                body = at + PREFIX.size
                if body + hlen + plen > len(buf):
                    break
                out.append((json.loads(buf[body:body + hlen]), bytes(buf[body + hlen:body + hlen + plen])))
                at = body + hlen + plen
            del buf[:at]
            if out:
                return out
            chunk = await self.reader.read(1 << 20)
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(buf), None)
            buf += chunk


class Outbox:
    """Frames put in one turn of the event loop go out in one write (a send per frame cost more than the frame)."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer, self.parts = writer, []

    def put(self, header: dict, parts: list = ()) -> None:
        if not self.parts:
            asyncio.get_running_loop().call_soon(self.flush)
        self.parts.extend(frame(header, parts))

    def flush(self) -> None:
        parts, self.parts = self.parts, []
        if parts and not self.writer.is_closing():
            self.writer.writelines(parts)


def describe(arrays: dict[str, np.ndarray], start: int) -> tuple[list, int]:
    """Entries for `arrays` laid out from byte `start` (each aligned) and the end of the layout."""
    entries, at = [], start
    for name, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise ServeError(f"tensor {name!r} of dtype {a.dtype} cannot cross the link; only numeric tensors can")
        entries.append([name, a.dtype.str, list(a.shape), at])
        at = aligned(at + a.nbytes)
    return entries, at


def write(buf, entries: list, arrays: dict[str, np.ndarray]) -> None:
    """Copy `arrays` into `buf` at their entries' offsets."""
    for name, dt, shape, at in entries:
        view(buf, dt, shape, at)[...] = arrays[name]


def inline(entries: list, arrays: dict[str, np.ndarray], start: int) -> list:
    """The payload parts that put `arrays` at their entries' offsets (relative to `start`), padding between."""
    parts, at = [], start
    for name, _, _, off in entries:
        if off > at:
            parts.append(bytes(off - at))
        a = np.ascontiguousarray(arrays[name])
        if a.nbytes:  # an empty array (shape [3, 0]) has no bytes to send, and memoryview cannot cast it
            parts.append(a)
        at = off + a.nbytes
    return parts


def view(buf, dtype: str, shape: list, at: int) -> np.ndarray:
    dt = np.dtype(dtype)
    count = math.prod(shape)  # np.prod costs ~10 µs a call
    return np.frombuffer(buf, dt, count, at).reshape(shape) if count else np.empty(shape, dt)


def read(buf, entries: list) -> dict[str, np.ndarray]:
    """The arrays `entries` describe in `buf` (views, not copies)."""
    return {name: view(buf, dt, shape, at) for name, dt, shape, at in entries}


def error_header(rid: int, e: ServeError) -> dict:
    return {"id": rid, "error": type(e).__name__, "message": str(e), "status": e.http_status}


def raise_error(header: dict) -> None:
    """Raise the ServeError a reply carries (its class by name, its HTTP status)."""
    cls = ERRORS.get(header["error"], ServeError)
    raise cls(header["message"], http_status=header.get("status"))
