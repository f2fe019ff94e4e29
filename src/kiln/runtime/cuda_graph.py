"""Whole-engine CUDA graphs: capture one run per input-shape signature, then replay it.

Replay copies the inputs into the graph's static buffers, launches the whole engine as one graph
(no per-layer Python or launch overhead) and returns copies of the static outputs. A run that cannot
be captured (a layer syncs with the host, say) stays eager for that signature, and says why.
A context keeps at most `max_graphs` graphs (least recently used go first); they share one memory pool,
which is safe because they replay one at a time on one stream and their outputs are copied out at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

import torch

from kiln.runtime.boundary_casts import BoundaryCasts
from kiln.runtime.io import bind_outputs

Signature = tuple
RunFn = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
DEFAULT_MAX_GRAPHS = 32


def signature(inputs: dict[str, torch.Tensor]) -> Signature | None:
    """Key of one captured graph; None when an input is not a CUDA tensor (not capturable)."""
    if not all(isinstance(v, torch.Tensor) and v.is_cuda for v in inputs.values()):
        return None
    return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(inputs.items()))


def clear_blas_workspaces() -> None:
    """Drop torch's per-stream cuBLAS / cuBLASLt workspaces (torch's cudagraph trees do the same around recording),
    so the next ones are made where the next matmul runs: inside a capture, in that graph's private pool."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # absent from CPU builds
    if clear is not None:
        clear()


class CapturedRun:
    """One captured engine run with its static input and output buffers.

    Captures are serialized (one lock for every context of the process) and thread-local, so other threads'
    contexts keep running while one captures."""

    _capturing = threading.Lock()

    def __init__(self, run: RunFn, inputs: dict[str, torch.Tensor], stream: torch.cuda.Stream, pool, pin: Any = None,
                 warm: bool = True, casts: BoundaryCasts = BoundaryCasts()):
        self.pin = pin  # what the graph reads besides its inputs (a dynamic engine's shape values): kept alive
        self.casts = casts  # `run` leaves these Casts to the copies in and out
        caller = torch.cuda.current_stream()
        stream.wait_stream(caller)
        with self._capturing:
            self._capture(run, inputs, stream, pool, warm)
        caller.wait_stream(stream)

    def _capture(self, run: RunFn, inputs: dict[str, torch.Tensor], stream: torch.cuda.Stream, pool,
                 warm: bool) -> None:
        self.inputs = {k: v.to(self.casts.inputs.get(k, v.dtype), copy=True) for k, v in inputs.items()}
        self.graph = torch.cuda.CUDAGraph()
        # warm-up on the side stream (unless the caller has just run these shapes on it): lazy handles and
        # workspaces are made outside capture. A layer that syncs with the host fails the thread-local capture
        # below (the caller then runs the signature eagerly on a new stream); the process-wide sync-debug mode is not
        # used, as it would fail other threads' runs meanwhile
        with torch.cuda.stream(stream):
            if warm:
                run(self.inputs)
            stream.synchronize()
            # cuBLAS(Lt) keeps a workspace per stream, made outside any capture by the warm-up; others free it at will
            # (torch.compile's reduce-overhead clears every workspace before recording), and a graph replayed on
            # freed memory faults. Cleared here, the capture makes its own in this graph's private pool
            clear_blas_workspaces()
            # capture_begin / capture_end rather than torch.cuda.graph, which also runs gc.collect() and
            # empty_cache() first: ~15 ms of a first call at a new shape
            self.graph.capture_begin(pool, capture_error_mode="thread_local")
            try:
                self.outputs = run(self.inputs)
            finally:
                self.graph.capture_end()

    def replay(self, inputs: dict[str, torch.Tensor], bound: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run the graph on the current stream; outputs copied out (into `bound` tensors where given), each folded
        Cast's conversion done by its copy."""
        if len(inputs) == 1:
            for k, v in inputs.items():
                self.inputs[k].copy_(v, non_blocking=True)
        else:  # one launch for all (BERT's three): each launch delays the graph's start by a few µs of host time
            torch._foreach_copy_([self.inputs[k] for k in inputs], list(inputs.values()), non_blocking=True)
        self.graph.replay()
        to = self.casts.outputs
        out = {k: v.to(to.get(k, v.dtype), copy=True) if isinstance(v, torch.Tensor) and k not in bound else v
               for k, v in self.outputs.items()}
        return bind_outputs(out, bound, to)


class GraphCache:
    """Per execution context: a captured run per signature (at most `max_graphs`, least recently used dropped),
    or the reason a signature runs eagerly."""

    def __init__(self, stream: torch.cuda.Stream, max_graphs: int = DEFAULT_MAX_GRAPHS,
                 casts: BoundaryCasts = BoundaryCasts()):
        self.stream = stream
        self.casts = casts  # the Casts each graph's run function leaves to its replay's copies
        self.max_graphs = max_graphs
        self.pool = torch.cuda.graph_pool_handle()
        self.runs: OrderedDict[Signature, CapturedRun] = OrderedDict()
        self.eager: dict[Signature, str] = {}
        self.captures = 0  # graphs captured so far (more than max_graphs: signatures were evicted and re-captured)
        self.failed_capture = False  # a capture that failed midway may leave its stream unusable

    def capturable(self, inputs: dict[str, torch.Tensor]) -> bool:
        sig = signature(inputs)
        return sig is not None and sig not in self.eager

    def run(self, run: RunFn, inputs: dict[str, torch.Tensor], bound: dict[str, torch.Tensor] | None = None,
            pin: Any = None, warm: bool = True) -> dict[str, torch.Tensor] | None:
        """Outputs from the graph for these inputs; None if this signature must run eagerly. `warm`: run once before
        a capture (False where the caller has just run these inputs' shapes on this cache's stream)."""
        sig = signature(inputs)
        if sig is None or sig in self.eager:
            return None
        captured = self.runs.get(sig)
        if captured is None:
            try:
                captured = CapturedRun(run, inputs, self.stream, self.pool, pin, warm, self.casts)
            except Exception as e:  # not capturable: remember why, run eagerly from now on
                torch.cuda.synchronize()
                self.eager[sig] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                self.failed_capture = True
                return None
            self.captures += 1
            self.runs[sig] = captured
            while len(self.runs) > self.max_graphs:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(sig)
        return captured.replay(inputs, bound or {})
