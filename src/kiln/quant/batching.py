"""Calibration and validation feeds fitted to the network's input shapes.

A network built for fixed shapes has its shape arithmetic folded (e.g. a mask gathered at batch·seq
indices), so it must only ever run batches of exactly those shapes: on CUDA another batch size reads out
of range (a device-side assert). Samples are re-batched to the network's batch B; a last, partial batch
is completed with samples from the start of the data (statistics are batch-independent, so only those
few samples count twice). A sample shape that differs from the network's is an InputError.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from kiln.errors import InputError
from kiln.ir import Network


def static_shapes(net: Network) -> dict[str, tuple[int, ...]]:
    """The network inputs whose shapes are fully static."""
    out = {}
    for name in net.inputs:
        shape = net.tensors[name].shape
        if shape is not None and all(isinstance(d, int) for d in shape):
            out[name] = tuple(shape)
    return out


def _check(feeds: dict[str, torch.Tensor], fixed: dict[str, tuple[int, ...]], what: str) -> None:
    for name, shape in fixed.items():
        got = tuple(feeds[name].shape)
        if len(got) != len(shape) or got[1:] != shape[1:]:
            raise InputError(f"{what} input {name!r} has shape {list(got)}, but the network is built for "
                             f"{list(shape)} (samples along axis 0); give samples of shape {list(shape[1:])}")


def fitted(net: Network, batches: Iterable[dict[str, torch.Tensor]], what: str = "calibration") \
        -> Iterator[dict[str, torch.Tensor]]:
    """`batches` re-batched to the network's static batch size (module docstring); unchanged when the
    network's inputs are not all static with one leading batch dimension."""
    fixed = static_shapes(net)
    batch = {s[0] for s in fixed.values() if s}
    if len(fixed) != len(net.inputs) or len(batch) != 1 or any(not s for s in fixed.values()):
        for feeds in batches:
            _check(feeds, {n: s for n, s in fixed.items() if s}, what)
            yield feeds
        return
    size = batch.pop()
    pending: dict[str, list[torch.Tensor]] = {n: [] for n in fixed}
    head: dict[str, list[torch.Tensor]] = {n: [] for n in fixed}
    have = seen = 0
    for feeds in batches:
        _check(feeds, fixed, what)
        rows = {feeds[n].shape[0] for n in fixed}
        if len(rows) != 1:
            raise InputError(f"{what} batch holds different sample counts per input ({sorted(rows)}); give one "
                             "count per batch")
        n = rows.pop()
        if seen < size:
            for name in fixed:
                head[name].append(feeds[name][: size - seen])
        seen += n
        for name in fixed:
            pending[name].append(feeds[name])
        have += n
        while have >= size:
            joined = {name: torch.cat(parts) for name, parts in pending.items()}
            yield {name: t[:size] for name, t in joined.items()}
            pending = {name: [t[size:]] for name, t in joined.items()}
            have -= size
    if have:
        first = {name: torch.cat(parts) for name, parts in head.items()}
        while have < size:  # complete the last batch from the start of the data, cycling when it is short
            take = min(size - have, seen)
            for name in fixed:
                pending[name].append(first[name][:take])
            have += take
        yield {name: torch.cat(parts) for name, parts in pending.items()}
