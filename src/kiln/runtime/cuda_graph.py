"""Whole-engine CUDA graphs: capture one run per input-shape signature, then replay it.

Replay copies the inputs into the graph's static buffers, launches the whole engine as one graph
(no per-layer Python or launch overhead) and returns copies of the static outputs. A run that cannot
be captured (a layer syncs with the host, say) stays eager for that signature, and says why.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

Signature = tuple
RunFn = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def signature(inputs: dict[str, torch.Tensor]) -> Signature | None:
    """Key of one captured graph; None when an input is not a CUDA tensor (not capturable)."""
    if not all(isinstance(v, torch.Tensor) and v.is_cuda for v in inputs.values()):
        return None
    return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(inputs.items()))


class CapturedRun:
    """One captured engine run with its static input and output buffers.

    Captures are serialized (one lock for every context of the process: the sync-debug mode of the warm-up
    is process-wide) and thread-local, so other threads' contexts keep running while one captures."""

    _capturing = threading.Lock()

    def __init__(self, run: RunFn, inputs: dict[str, torch.Tensor], stream: torch.cuda.Stream):
        with self._capturing:
            self._capture(run, inputs, stream)

    def _capture(self, run: RunFn, inputs: dict[str, torch.Tensor], stream: torch.cuda.Stream) -> None:
        self.inputs = {k: v.clone() for k, v in inputs.items()}
        self.graph = torch.cuda.CUDAGraph()
        # warm-up on the side stream (lazy handles and workspaces are made outside capture); a layer that
        # synchronizes with the host raises here, before a capture could be left half-done
        old = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.cuda.stream(stream):
                run(self.inputs)
        finally:
            torch.cuda.set_sync_debug_mode(old)
        stream.synchronize()
        with torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
            self.outputs = run(self.inputs)

    def replay(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for k, v in inputs.items():
            self.inputs[k].copy_(v, non_blocking=True)
        self.graph.replay()
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.outputs.items()}


class GraphCache:
    """Per execution context: a captured run per signature, or the reason a signature runs eagerly."""

    def __init__(self, stream: torch.cuda.Stream):
        self.stream = stream
        self.runs: dict[Signature, CapturedRun] = {}
        self.eager: dict[Signature, str] = {}
        self.failed_capture = False  # a capture that failed midway may leave its stream unusable

    def run(self, run: RunFn, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Outputs from the graph for these inputs; None if this signature must run eagerly."""
        sig = signature(inputs)
        if sig is None or sig in self.eager:
            return None
        captured = self.runs.get(sig)
        if captured is None:
            try:
                captured = self.runs[sig] = CapturedRun(run, inputs, self.stream)
            except Exception as e:  # not capturable: remember why, run eagerly from now on
                torch.cuda.synchronize()
                self.eager[sig] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                self.failed_capture = True
                return None
        return captured.replay(inputs)
