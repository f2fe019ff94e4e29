"""The activation arena of one execution context: one device block, each planned activation at its offset."""

from __future__ import annotations

import torch


class Arena:
    """Allocated once per context (contexts run concurrently, so each has its own); `buffers[k]` holds, per output
    of layer k, the uint8 view its kernel writes into, or None for a layer with no planned output."""

    def __init__(self, engine):
        plan = engine.memory_plan
        self.nbytes = plan.arena_bytes or 0
        self.block = torch.empty(self.nbytes, dtype=torch.uint8, device=engine.device.torch_device) \
            if self.nbytes else None
        self.buffers = None
        if self.block is not None:
            self.buffers = [None if s is None else [None if p is None else self.block[p[0]:p[0] + p[1]] for p in s]
                            for s in plan.slots(engine.network)]

    def holds(self, value) -> bool:
        """Whether `value` is (a view of) arena memory, which the next run overwrites."""
        if self.block is None or not isinstance(value, torch.Tensor) or value.device != self.block.device:
            return False
        start = self.block.data_ptr()
        return start <= value.untyped_storage().data_ptr() < start + self.nbytes
