"""Output tensors of kernels: a view into a given byte buffer (the engine's activation arena), else fresh memory."""

from __future__ import annotations

import math

import torch

from kiln.errors import InternalError


def take(buffer: torch.Tensor | None, shape, dtype: torch.dtype, device,
         memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """An uninitialized tensor of `shape` and `dtype`: laid out in `buffer` (uint8, from the memory plan) when
    given, else allocated like torch.empty. channels_last means NHWC memory for an NCHW shape."""
    if buffer is None:
        return torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
    shape = tuple(shape)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes > buffer.numel():
        raise InternalError(f"planned buffer of {buffer.numel()} bytes is too small for {shape} {dtype}")
    flat = buffer[:nbytes].view(dtype)
    if memory_format == torch.channels_last:
        n, c, h, w = shape
        return flat.view(n, h, w, c).permute(0, 3, 1, 2)
    return flat.view(shape)
