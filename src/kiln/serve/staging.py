"""A batch's host-side input buffers: on a CUDA engine one pinned block per execution context, reused batch after
batch, so that each request is copied once (into its rows) and the block goes to the GPU without a second copy."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

ALIGN = 64  # each array starts on a 64-byte boundary of the block
SMALL_BATCH_BYTES = 256 << 10  # below this a batch is gathered by numpy, holding Python's lock


class Staging:
    """Carves the arrays of one batch out of one host block that grows to the largest batch met; `pinned`: page-locked
    (CUDA) memory, else plain numpy memory. A context's batches run one at a time, so one block per context."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self.block: np.ndarray = np.empty(0, np.uint8)

    def arrays(self, specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, np.ndarray]:
        """Uninitialised arrays of the given (shape, dtype) each, views of the block (valid until the next call)."""
        offsets, total = {}, 0
        for name, (shape, dtype) in specs.items():
            offsets[name] = total
            total += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
        if total > self.block.nbytes:
            size = max(total, self.block.nbytes * 5 // 4)  # grows rarely: a model's batches are bounded
            self.block = (torch.empty(size, dtype=torch.uint8, pin_memory=True).numpy() if self.pinned
                          else np.empty(size, np.uint8))
        return {name: self.block[at:at + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
                for (name, (shape, dtype)), at in zip(specs.items(), offsets.values())}


def stageable(dtype: np.dtype) -> bool:
    """Whether an input of `dtype` can be assembled in a staging block: numeric and bool, not strings or objects."""
    return dtype.kind in "biuf"


def gather(parts: list[np.ndarray], dest: np.ndarray) -> None:
    """Copy `parts` one after another into `dest`'s leading rows in one call that releases Python's lock once: a
    copy per part would wait for the lock after each (the event loop holds it meanwhile)."""
    rows = sum(len(p) for p in parts)
    if dest.dtype.kind not in "biuf" or rows * dest[:1].nbytes < SMALL_BATCH_BYTES:
        np.concatenate(parts, out=dest[:rows])  # small copies keep the lock: no wait to take it back
        return
    with warnings.catch_warnings():  # requests' arrays are read-only views of their bytes; torch only reads them
        warnings.simplefilter("ignore", UserWarning)
        tensors = [torch.from_numpy(p) for p in parts]
    torch.cat(tensors, out=torch.from_numpy(dest)[:rows])
