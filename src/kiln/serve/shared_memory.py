"""Triton's shared memory extensions: the registry of client-made regions that inputs are read from and outputs
written into, shared by the HTTP and gRPC servers. System regions are POSIX shared memory (/dev/shm/KEY, mapped on
register); CUDA regions are device allocations a client shares by CUDA IPC handle (served on a GPU server)."""

from __future__ import annotations

import math
import mmap
import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kiln.serve.dtypes import torch_dtype
from kiln.serve.errors import AlreadyExists, BadRequest, RegionNotFound, Unsupported

SHM_DIR = "/dev/shm"
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMS = (REGION, OFFSET, BYTE_SIZE)
MAX_NAME = 256
OFF = "shared memory is off on this server: start it with `kiln serve --shared-memory`"
SYSTEM, CUDA = "system", "cuda"
# opens a CUDA region: (name, raw handle, device id, byte size) → a uint8 tensor of byte size (cuda_ipc.open_handle)
CudaOpener = Callable[[str, bytes, int, int], torch.Tensor]


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lies: `byte_size` bytes at `offset` into the registered region `region`."""

    region: str
    offset: int
    byte_size: int



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
    """One registered system region: `byte_size` bytes at `offset` into the object `key`, mapped read-write."""

    kind = SYSTEM

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

    def read(self, at: int, dtype: np.dtype, shape: list[int]) -> np.ndarray:
        """A copy of the little-endian `shape` array of `dtype` at byte `at`."""
        view = np.frombuffer(self.mm, dtype.newbyteorder("<"), math.prod(shape), self.start + at)
        array = view.astype(dtype.newbyteorder("="), copy=True)
        del view  # no buffer of the mapping may outlive the registry's lock: unregister closes it
        return array.reshape(shape)

    def write(self, at: int, data: np.ndarray) -> None:
        """Write the bytes `data` (uint8) at byte `at`."""
        view = np.frombuffer(self.mm, np.uint8, data.size, self.start + at)
        view[:] = data
        del view

    def close(self) -> None:
        self.mm.close()


class _CudaRegion:
    """One registered CUDA region: `byte_size` bytes of a client's device allocation, a uint8 tensor `buffer`.
    Inputs are read as views of it (no copy: the engine reads them in place); closed when the last view is freed."""

    kind = CUDA

    def __init__(self, name: str, device_id: int, byte_size: int, buffer: torch.Tensor):
        self.name, self.device_id, self.byte_size, self.buffer = name, device_id, byte_size, buffer

    def status(self) -> dict:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, at: int, dtype: np.dtype, shape: list[int]) -> torch.Tensor:
        """The `shape` tensor of `dtype` at byte `at`, a view; BadRequest when `at` is not a multiple of its size."""
        if at % dtype.itemsize:
            raise BadRequest(f"{OFFSET} {at} into CUDA shared memory region {self.name!r} is not a multiple of "
                             f"{dtype.itemsize}, the size of a {dtype} element")
        return self.buffer[at:at + math.prod(shape) * dtype.itemsize].view(torch_dtype(dtype)).view(shape)

    def write(self, at: int, data: np.ndarray) -> None:
        """Copy the bytes `data` (uint8) to byte `at` (host to device, finished on return)."""
        self.buffer[at:at + data.size].copy_(torch.from_numpy(data))

    def close(self) -> None:
        self.buffer = None  # the handle closes once no request's view holds it


class SharedMemoryRegistry:
    """The shared memory regions clients registered with this server process, by name (one namespace for system and
    CUDA regions, as Triton's). `cuda`: opens CUDA regions (None: the server has no GPU, and serves system ones)."""

    def __init__(self, cuda: CudaOpener | None = None):
        if not os.path.isdir(SHM_DIR):
            raise Unsupported(f"system shared memory needs {SHM_DIR} (Linux)")
        self.cuda = cuda
        self._regions: dict[str, _Region | _CudaRegion] = {}
        self._lock = threading.Lock()

    @property
    def extensions(self) -> list[str]:
        """The protocol extensions served: system shared memory, and CUDA shared memory on a GPU server."""
        return ["system_shared_memory"] + (["cuda_shared_memory"] if self.cuda is not None else [])

    def register(self, name, key, offset, byte_size) -> None:
        """Map `byte_size` bytes at `offset` of the shared memory object `key` as region `name`."""
        what = f"shared memory region {name!r}"
        byte_size = self._size(name, byte_size)
        offset = _count(offset, what, "offset")
        shm_path(key)
        with self._lock:
            self._free(name)
            self._regions[name] = _Region(name, key, offset, byte_size)

    def register_cuda(self, name, raw_handle, device_id, byte_size) -> None:
        """Open the device allocation of the CUDA IPC handle `raw_handle` (bytes) on GPU `device_id` as region
        `name` of `byte_size` bytes."""
        if self.cuda is None:
            raise Unsupported("CUDA shared memory needs a server on a GPU (kiln serve --device cuda "
                              "--shared-memory); use system shared memory on this one")
        what = f"CUDA shared memory region {name!r}"
        byte_size, device_id = self._size(name, byte_size), _count(device_id, what, "device_id")
        if not isinstance(raw_handle, (bytes, bytearray)):
            raise BadRequest(f"{what}: raw_handle must be the handle's bytes")
        with self._lock:
            self._free(name)
            self._regions[name] = _CudaRegion(name, device_id, byte_size,
                                              self.cuda(name, bytes(raw_handle), device_id, byte_size))

    @staticmethod
    def _size(name, byte_size) -> int:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\x00" in name:
            raise BadRequest(f"invalid shared memory region name {str(name)[:80]!r}")
        if _count(byte_size, f"shared memory region {name!r}", "byte_size") == 0:
            raise BadRequest(f"shared memory region {name!r}: byte_size must be positive")
        return byte_size

    def _free(self, name: str) -> None:
        if name in self._regions:
            raise AlreadyExists(f"shared memory region {name!r} is already registered (as {self._regions[name].kind} "
                                "shared memory); unregister it first")

    def unregister(self, name: str = "", kind: str = SYSTEM) -> None:
        """Unmap region `name` of `kind` (every such region when empty); an unknown name is no error, as in Triton."""
        with self._lock:
            names = [name] if name else list(self._regions)
            regions = [self._regions.pop(n) for n in names if n in self._regions and self._regions[n].kind == kind]
            for region in regions:
                region.close()

    def status(self, name: str = "", kind: str = SYSTEM) -> list[dict]:
        """The status of region `name` of `kind` (RegionNotFound) or, when empty, of every region of `kind`: system
        {name, key, offset, byte_size}, CUDA {name, device_id, byte_size}."""
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values() if r.kind == kind]
            if name not in self._regions or self._regions[name].kind != kind:
                raise RegionNotFound(f"no {kind} shared memory region {name!r} is registered")
            return [self._regions[name].status()]

    def _find(self, what: str, ref: TensorRef) -> _Region | _CudaRegion:
        region = self._regions.get(ref.region)
        if region is None:
            raise RegionNotFound(f"{what}: no shared memory region {ref.region!r} is registered")
        if ref.offset + ref.byte_size > region.byte_size:
            raise BadRequest(f"{what}: {OFFSET} {ref.offset} + {BYTE_SIZE} {ref.byte_size} runs past the end of "
                             f"shared memory region {ref.region!r} ({region.byte_size} bytes)")
        return region

    def check(self, what: str, ref: TensorRef) -> None:
        """RegionNotFound / BadRequest unless `ref` lies inside a registered region."""
        with self._lock:
            self._find(what, ref)

    def read(self, what: str, ref: TensorRef, datatype: str, dtype, shape: list[int]) -> np.ndarray | torch.Tensor:
        """The `shape` array of `dtype` at `ref`, whose byte size must be `ref.byte_size`: a numpy copy from a system
        region (little-endian), a device tensor viewing a CUDA region."""
        dtype = check_size(what, ref, datatype, dtype, shape)
        with self._lock:
            return self._find(what, ref).read(ref.offset, dtype, list(shape))

    def write(self, what: str, ref: TensorRef, array: np.ndarray) -> None:
        """Write `array` (little-endian) at `ref`; BadRequest when it is larger than `ref.byte_size`."""
        data = np.ascontiguousarray(array, np.asarray(array).dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
        if data.size > ref.byte_size:
            raise BadRequest(f"{what}: {BYTE_SIZE} {ref.byte_size} is too small for the {data.size} bytes of the "
                             "result")
        with self._lock:
            self._find(what, ref).write(ref.offset, data)

    def close(self) -> None:
        """Unmap every region (the server is shutting down)."""
        for kind in (SYSTEM, CUDA):
            self.unregister(kind=kind)


def check_size(what: str, ref: TensorRef, datatype: str, dtype, shape: list[int]) -> np.dtype:
    """`dtype` as a numpy dtype; BadRequest unless `ref.byte_size` is the byte size of a `shape` array of it."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    if ref.byte_size != count * dtype.itemsize:
        raise BadRequest(f"{what}: {BYTE_SIZE} {ref.byte_size} does not match shape {list(shape)} of {datatype} "
                         f"({count * dtype.itemsize} bytes)")
    return dtype


def off_error() -> Unsupported:
    return Unsupported(OFF)
