"""The torch peers kiln is measured against: eager and the three torch.compile modes, set up as anchors.md says."""

from __future__ import annotations

import copy
import time
from typing import Callable

import torch

from benchmarks.roofline import DTYPES

PEERS = ("eager", "default", "reduce-overhead", "max-autotune")
OPT_IN = ("max-autotune",)  # minutes of compiling per model and batch: only for models named with --max-autotune


def prepare(module: torch.nn.Module, inputs: dict[str, torch.Tensor], precision: str, device: str,
            channels_last: bool) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """A copy of the model and the inputs in `precision` on `device` (float tensors cast; CNNs channels_last)."""
    model = copy.deepcopy(module).to(device=device, dtype=DTYPES[precision]).eval()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, cast_inputs(inputs, precision, device, channels_last)


def cast_inputs(inputs: dict[str, torch.Tensor], precision: str, device: str,
                channels_last: bool) -> list[torch.Tensor]:
    """The inputs as `prepare` gives them to a peer: float tensors in `precision`, images channels_last."""
    dtype = DTYPES[precision]
    args = [v.to(device=device, dtype=dtype) if v.is_floating_point() else v.to(device) for v in inputs.values()]
    if channels_last:
        args = [a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args]
    return args


def runner(peer: str, model: torch.nn.Module, args: list[torch.Tensor]) -> tuple[Callable[[], object], float]:
    """A no-argument call of the peer and its first call's seconds (compile time for torch.compile modes)."""
    fn = model
    if peer != "eager":
        torch._dynamo.reset()  # a fresh compile per row: no recompiles with dynamic shapes from the previous row
        fn = torch.compile(model, mode=peer)

    def call():
        with torch.no_grad():
            return fn(*args)

    start = time.perf_counter()
    call()
    if args[0].is_cuda:
        torch.cuda.synchronize()
    return call, time.perf_counter() - start
