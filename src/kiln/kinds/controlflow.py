"""Reference implementations of the control-flow layer kinds: If, Loop, Scan.

A body is a nested `Network` in an attribute and runs through the one executor
(`kiln.kinds.interpret.run_network`). Values a body reads from the enclosing graph are the
layer's last `captures` inputs (for If: every input after `cond`), passed as the body's last inputs.
"""

from __future__ import annotations

from typing import Any

import torch

from kiln.ir import Network
from kiln.kinds.interpret import run_network
from kiln.kinds.registry import INT, INTS, NETWORK, kind

BODIES = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",), "SequenceMap": ("body",)}


def run_body(body: Network, inputs: list[Any], device: torch.device) -> list[Any]:
    return run_network(body, inputs, device)


def empty_stack(body: Network, output: int, device: torch.device) -> torch.Tensor:
    """The stack of zero iterations of a body output: [0, *element shape] where that shape is known, else [0]."""
    t = body.tensors[body.outputs[output]]
    shape = t.shape if t.is_static else ()
    return torch.empty((0, *shape), dtype=t.dtype.torch, device=device)


@kind("If", attrs={"else_branch": NETWORK.req, "then_branch": NETWORK.req})
def if_(inputs, attrs):
    cond, captured = inputs[0], inputs[1:]
    branch = attrs["then_branch"] if bool(cond.reshape(-1)[0]) else attrs["else_branch"]
    return run_body(branch, captured, cond.device)


@kind("Loop", attrs={"body": NETWORK.req, "captures": INT.req})
def loop(inputs, attrs):
    """ONNX Loop: run while iteration < M and cond; carried values feed back, scan outputs stack on a new axis 0."""
    body, captures = attrs["body"], attrs["captures"]
    trip, cond = inputs[0], inputs[1]
    n = len(inputs) - 2 - captures
    carried, captured = list(inputs[2:2 + n]), inputs[2 + n:]
    device = (trip if trip is not None else cond).device
    limit = None if trip is None else int(trip.reshape(-1)[0])
    going = True if cond is None else bool(cond.reshape(-1)[0])
    scans, i = [], 0
    while going and (limit is None or i < limit):
        counter = torch.tensor(i, dtype=torch.int64, device=device)
        outs = run_body(body, [counter, torch.tensor(going, device=device), *carried, *captured], device)
        going, carried = bool(outs[0].reshape(-1)[0]), outs[1:1 + n]
        scans.append(outs[1 + n:])
        i += 1
    k = len(body.outputs) - 1 - n
    return [*carried, *(torch.stack([s[j] for s in scans]) if scans else empty_stack(body, 1 + n + j, device)
                        for j in range(k))]


@kind("Scan", attrs={"batched": INT.req, "body": NETWORK.req, "captures": INT.req, "directions": INTS,
                     "num_scan_inputs": INT.req, "scan_input_axes": INTS.req, "scan_input_directions": INTS.req,
                     "scan_output_axes": INTS.req, "scan_output_directions": INTS.req})
def scan(inputs, attrs):
    """ONNX Scan (opset 9+ attributes); `batched` (opset 8) scans each index of axis 0 separately."""
    if not attrs["batched"]:
        return _scan(inputs, attrs)
    count = len(inputs) - attrs["captures"]
    per_batch = [_scan([v[b] for v in inputs[:count]] + inputs[count:], attrs) for b in range(inputs[0].shape[0])]
    return [torch.stack(list(values)) for values in zip(*per_batch)]


def _scan(inputs, attrs):
    body, captures, m = attrs["body"], attrs["captures"], attrs["num_scan_inputs"]
    n = len(inputs) - captures - m
    states, captured = list(inputs[:n]), inputs[n + m:]
    xs = [x.movedim(axis, 0) for x, axis in zip(inputs[n:n + m], attrs["scan_input_axes"])]
    xs = [x.flip(0) if reverse else x for x, reverse in zip(xs, attrs["scan_input_directions"])]
    steps = xs[0].shape[0]
    if any(x.shape[0] != steps for x in xs):
        raise ValueError(f"scan inputs have different lengths along their scan axes: {[x.shape[0] for x in xs]}")
    collected = []
    for t in range(steps):
        outs = run_body(body, [*states, *(x[t] for x in xs), *captured], xs[0].device)
        states = outs[:n]
        collected.append(outs[n:])
    ys = []
    for j, (axis, reverse) in enumerate(zip(attrs["scan_output_axes"], attrs["scan_output_directions"])):
        parts = [c[j] for c in collected][::-1 if reverse else 1]
        y = torch.stack(parts) if parts else empty_stack(body, n + j, xs[0].device)
        ys.append(y.movedim(0, axis))
    return [*states, *ys]
