"""Triton's system shared memory extension: the registry of client-made POSIX shared memory regions (/dev/shm/KEY,
mapped on register) that inputs are read from and outputs written into, shared by the HTTP and gRPC servers."""

from __future__ import annotations

import math
import mmap
import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kiln.serve.errors import AlreadyExists, BadRequest, RegionNotFound, Unsupported

SHM_DIR = "/dev/shm"
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMS = (REGION, OFFSET, BYTE_SIZE)
MAX_NAME = 256
OFF = "system shared memory is off on this server: start it with `kiln serve --shared-memory`"


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lies: `byte_size` bytes at `offset` into the registered region `region`."""

    region: str
    offset: int
    byte_size: int

    def parameters(self) -> dict:
        """The tensor's shared memory parameters, as the request gave them (a zero offset left out)."""
        params = {REGION: self.region, BYTE_SIZE: self.byte_size}
        return {**params, OFFSET: self.offset} if self.offset else params


def _count(value, what: str, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{what}: {field} must be a non-negative integer, got {str(value)[:40]!r}")
    return value


def tensor_ref(what: str, params: Mapping, enabled: bool = True) -> TensorRef | None:
    """The shared memory parameters among a tensor's `params` (None: it has none); BadRequest naming `what`, or
    Unsupported when the server serves no shared memory (`enabled` False)."""
    if not any(p in params for p in PARAMS):
        return None
    if not enabled:
        raise off_error()
    region = params.get(REGION)
    if REGION not in params or BYTE_SIZE not in params:
        raise BadRequest(f"{what}: shared memory needs both {REGION} and {BYTE_SIZE}")
    if not isinstance(region, str) or not region:
        raise BadRequest(f"{what}: {REGION} must be a region name")
    return TensorRef(region, _count(params.get(OFFSET, 0), what, OFFSET), _count(params[BYTE_SIZE], what, BYTE_SIZE))


def shm_path(key) -> str:
    """The /dev/shm path of a POSIX shared memory key ("/name" or "name"); BadRequest for anything else."""
    name = key[1:] if isinstance(key, str) and key.startswith("/") else key
    if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in ("/", "\\", "\x00")):
        raise BadRequest(f"invalid shared memory key {str(key)[:80]!r}: give one POSIX shared memory name such as "
                         "'/input0' (no '/' after the leading one, no '..', '\\' or NUL)")
    return os.path.join(SHM_DIR, name)


class _Region:
    """One registered region: `byte_size` bytes at `offset` into the object `key`, mapped read-write."""

    def __init__(self, name: str, key: str, offset: int, byte_size: int):
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        path = shm_path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BadRequest(f"shared memory region {name!r}: no shared memory object {key!r} ({path}); create it "
                             "first (tritonclient.utils.shared_memory.create_shared_memory_region)") from None
        except OSError as e:
            raise BadRequest(f"shared memory region {name!r}: cannot open {key!r} read-write: "
                             f"{e.strerror or e}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise BadRequest(f"shared memory region {name!r}: {key!r} is not a shared memory object")
            if offset + byte_size > info.st_size:
                raise BadRequest(f"shared memory region {name!r}: offset {offset} + byte_size {byte_size} runs past "
                                 f"the end of {key!r} ({info.st_size} bytes)")
            self.start = offset % mmap.ALLOCATIONGRANULARITY  # mmap offsets must be page-aligned
            self.mm = mmap.mmap(fd, self.start + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                offset=offset - self.start)
        finally:
            os.close(fd)

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemoryRegistry:
    """The system shared memory regions clients registered with this server process, by name."""

    def __init__(self):
        if not os.path.isdir(SHM_DIR):
            raise Unsupported(f"system shared memory needs {SHM_DIR} (Linux)")
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()

    def register(self, name, key, offset, byte_size) -> None:
        """Map `byte_size` bytes at `offset` of the shared memory object `key` as region `name`."""
        if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\x00" in name:
            raise BadRequest(f"invalid shared memory region name {str(name)[:80]!r}")
        what = f"shared memory region {name!r}"
        offset, byte_size = _count(offset, what, "offset"), _count(byte_size, what, "byte_size")
        if byte_size == 0:
            raise BadRequest(f"{what}: byte_size must be positive")
        shm_path(key)
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"{what} is already registered; unregister it first")
            self._regions[name] = _Region(name, key, offset, byte_size)

    def unregister(self, name: str = "") -> None:
        """Unmap region `name` (every region when empty); an unknown name is no error, as in Triton."""
        with self._lock:
            if name:
                regions = [self._regions.pop(name)] if name in self._regions else []
            else:
                regions, self._regions = list(self._regions.values()), {}
            for region in regions:
                region.mm.close()

    def status(self, name: str = "") -> list[dict]:
        """[{name, key, offset, byte_size}] of region `name` (RegionNotFound) or, when empty, of every region."""
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values()]
            if name not in self._regions:
                raise RegionNotFound(f"no system shared memory region {name!r} is registered")
            return [self._regions[name].status()]

    def _find(self, what: str, ref: TensorRef) -> _Region:
        region = self._regions.get(ref.region)
        if region is None:
            raise RegionNotFound(f"{what}: no system shared memory region {ref.region!r} is registered")
        if ref.offset + ref.byte_size > region.byte_size:
            raise BadRequest(f"{what}: {OFFSET} {ref.offset} + {BYTE_SIZE} {ref.byte_size} runs past the end of "
                             f"shared memory region {ref.region!r} ({region.byte_size} bytes)")
        return region

    def check(self, what: str, ref: TensorRef) -> None:
        """RegionNotFound / BadRequest unless `ref` lies inside a registered region."""
        with self._lock:
            self._find(what, ref)

    def read(self, what: str, ref: TensorRef, datatype: str, dtype, shape: list[int]) -> np.ndarray:
        """A copy of the `shape` array of `dtype` at `ref` (little-endian); its byte size must be `ref.byte_size`."""
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        if ref.byte_size != count * dtype.itemsize:
            raise BadRequest(f"{what}: {BYTE_SIZE} {ref.byte_size} does not match shape {list(shape)} of {datatype} "
                             f"({count * dtype.itemsize} bytes)")
        with self._lock:
            region = self._find(what, ref)
            view = np.frombuffer(region.mm, dtype.newbyteorder("<"), count, region.start + ref.offset)
            array = view.astype(dtype.newbyteorder("="), copy=True)
            del view  # no buffer of the mapping may outlive the lock: unregister closes it
        return array.reshape(shape)

    def write(self, what: str, ref: TensorRef, array: np.ndarray) -> None:
        """Write `array` (little-endian) at `ref`; BadRequest when it is larger than `ref.byte_size`."""
        data = np.ascontiguousarray(array, np.asarray(array).dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
        if data.size > ref.byte_size:
            raise BadRequest(f"{what}: {BYTE_SIZE} {ref.byte_size} is too small for the {data.size} bytes of the "
                             "result")
        with self._lock:
            region = self._find(what, ref)
            view = np.frombuffer(region.mm, np.uint8, data.size, region.start + ref.offset)
            view[:] = data
            del view

    def close(self) -> None:
        """Unmap every region (the server is shutting down)."""
        self.unregister()


def off_error() -> Unsupported:
    return Unsupported(OFF)
