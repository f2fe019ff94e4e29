"""NVTX ranges around each layer's kernel, so that Nsight Systems shows kiln's layers (`--nvtx`,
`engine.create_context(nvtx=True)`).

NVTX ranges are recorded when the host launches work, so a replayed CUDA graph shows none: a context with NVTX on
runs its layers eagerly. The wrappers exist only when asked for; without them a run costs nothing extra.
"""

from __future__ import annotations

from typing import Callable

import torch

from kiln.errors import ConfigError
from kiln.ir import Layer

Kernel = Callable[..., list]


def label(layer: Layer) -> str:
    """A layer's range name: `kiln:<layer name> (<kind>)`."""
    return f"kiln:{layer.name} ({layer.kind})"


def ranged_kernels(engine, push: Callable[[str], object] | None = None,
                   pop: Callable[[], object] | None = None, kernels: list[Kernel] | None = None) -> list[Kernel]:
    """One kernel per layer of `engine`, each calling the current kernel for that step in `kernels` (the engine's
    unless given) inside an NVTX range named by `label` (`push` / `pop`: torch.cuda.nvtx's range_push / range_pop
    unless given)."""
    push = push or torch.cuda.nvtx.range_push
    pop = pop or torch.cuda.nvtx.range_pop
    kernels = engine.kernels if kernels is None else kernels
    return [_ranged(kernels, step, label(layer), push, pop) for step, layer in enumerate(engine.network.layers)]


def _ranged(kernels: list[Kernel], step: int, name: str, push, pop) -> Kernel:
    def kernel(args, **kw):
        try:
            push(name)
        except RuntimeError as e:  # torch without CUDA: "NVTX functions not installed"
            raise ConfigError(f"NVTX ranges need a CUDA build of torch ({e}); run without nvtx") from None
        try:
            return kernels[step](args, **kw)  # looked up per call: a loaded plan swaps in its checked kernels
        finally:
            pop()

    return kernel
