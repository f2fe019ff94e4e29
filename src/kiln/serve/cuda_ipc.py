"""Triton's CUDA shared memory: a client's CUDA IPC handle (the 64 bytes of a cudaIpcMemHandle_t) opened as a torch
byte tensor over the device allocation it names, so that requests read their inputs where the client wrote them.
Uses NVIDIA's cuda-bindings (`pip install 'kiln[serve-cuda]'`), imported on first use."""

from __future__ import annotations

import ctypes

import torch

from kiln.serve.errors import BadRequest, Unsupported

HANDLE_BYTES = 64  # CUDA_IPC_HANDLE_SIZE


def _bindings():
    try:
        from cuda.bindings import driver, runtime
    except ImportError:
        raise Unsupported("CUDA shared memory needs NVIDIA's cuda-bindings package on the server: "
                          "pip install 'kiln[serve-cuda]' (or cuda-python)") from None
    return driver, runtime


class _Mapping:
    """One opened IPC handle, seen by torch through `__cuda_array_interface__`; the handle is closed when the last
    tensor over it is freed (a region unregistered while a request still reads it stays open until then)."""

    def __init__(self, runtime, ptr: int, byte_size: int):
        self._runtime, self.ptr = runtime, ptr
        self.__cuda_array_interface__ = {"shape": (byte_size,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3}

    def __del__(self):
        self._runtime.cudaIpcCloseMemHandle(self.ptr)


def open_handle(name: str, raw_handle: bytes, device_id: int, byte_size: int) -> torch.Tensor:
    """The `byte_size` bytes at the start of the allocation `raw_handle` names on GPU `device_id`, as a uint8 tensor;
    BadRequest when the handle does not open or the allocation is smaller than `byte_size`."""
    what = f"CUDA shared memory region {name!r}"
    if len(raw_handle) != HANDLE_BYTES:
        raise BadRequest(f"{what}: raw_handle holds {len(raw_handle)} bytes; a CUDA IPC handle has {HANDLE_BYTES} "
                         "(tritonclient.utils.cuda_shared_memory.get_raw_handle)")
    if not 0 <= device_id < torch.cuda.device_count():
        raise BadRequest(f"{what}: device_id {device_id} is not a GPU of this server "
                         f"(it has {torch.cuda.device_count()})")
    driver, runtime = _bindings()
    handle = runtime.cudaIpcMemHandle_t()
    ctypes.memmove(handle.getPtr(), raw_handle, HANDLE_BYTES)
    err, previous = runtime.cudaGetDevice()
    runtime.cudaSetDevice(device_id)
    try:
        err, ptr = runtime.cudaIpcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess)
        if err != runtime.cudaError_t.cudaSuccess:
            raise BadRequest(f"{what}: the CUDA IPC handle does not open on GPU {device_id} ({err.name}); pass the "
                             "handle of a live cudaMalloc allocation made on this machine by another process")
        mapping = _Mapping(runtime, int(ptr), byte_size)
        err, base, size = driver.cuMemGetAddressRange(int(ptr))
        if err != driver.CUresult.CUDA_SUCCESS or int(size) - (int(ptr) - int(base)) < byte_size:
            raise BadRequest(f"{what}: byte_size {byte_size} is larger than the allocation the handle names "
                             f"({int(size) if err == driver.CUresult.CUDA_SUCCESS else 'unknown'} bytes)")
        return torch.as_tensor(mapping, device=f"cuda:{device_id}")
    finally:
        runtime.cudaSetDevice(previous)
