"""Liveness-based memory plan: when each activation dies, and its offset in the activation arena.

Offsets go to the outputs of layers whose kernel writes into a given buffer (`placed`), for static
shapes. A layer whose kernel may return a view of an input (`fresh` says which cannot) keeps that
input's arena bytes alive as long as its own outputs live. Network outputs are not placed; one that
is a view of arena memory is copied out by the context (runtime/arena.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.ir import DType, Network

ALIGN = 256


@dataclass
class MemoryPlan:
    """`release[k]` lists the tensors whose last reader is layer k; `offsets` place tensors in the arena."""

    release: list[list[str]]
    offsets: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    arena_bytes: int | None = None
    unplaced: int = 0  # activations the layers' own kernels allocate (their library takes no output buffer)

    def to_json(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "offsets": self.offsets, "unplaced": self.unplaced}

    def slots(self, net: Network) -> list[list[tuple[int, int] | None] | None]:
        """Per layer, (offset, bytes) of each output in the arena (None: not placed); None for a layer with none."""
        out = []
        for layer in net.layers:
            s = [(self.offsets[o], self.sizes[o]) if o in self.offsets else None for o in layer.outputs]
            out.append(s if any(s) else None)
        return out


def plan_memory(net: Network, placed: set[str] = frozenset(), fresh: set[str] = frozenset()) -> MemoryPlan:
    """Release points for every activation; arena offsets for the outputs of the layers named in `placed`
    (their kernels take output buffers); `fresh` names layers whose outputs never alias their inputs."""
    keep = set(net.outputs) | set(net.constants) | set(net.inputs)
    last: dict[str, int] = {}
    born: dict[str, int] = {}
    for k, layer in enumerate(net.layers):
        for i in layer.inputs:
            if i:
                last[i] = k
        for o in layer.outputs:
            if o:
                born.setdefault(o, k)
                last.setdefault(o, k)  # an unread output dies where it is made
    release: list[list[str]] = [[] for _ in net.layers]
    for name, k in last.items():
        if name not in keep:
            release[k].append(name)
    plan = MemoryPlan(release)
    _assign_offsets(net, plan, born, _storage_lifetimes(net, last, placed | fresh), keep, placed)
    return plan


def _storage_lifetimes(net: Network, last: dict[str, int], fresh: set[str]) -> dict[str, int]:
    """Last step at which each tensor's storage may be read: through itself or any view made of it."""
    roots: dict[str, set[str]] = {}
    for layer in net.layers:
        for o in layer.outputs:
            if not o:
                continue
            if layer.name in fresh:
                roots[o] = {o}
            else:
                roots[o] = {o}.union(*(roots.get(i, set()) for i in layer.inputs if i))
    end = dict(last)
    for t, rs in roots.items():
        for r in rs - {t}:
            end[r] = max(end[r], last[t])
    return end


def _assign_offsets(net, plan, born, end, keep, placed) -> None:
    """First-fit offsets over storage lifetimes; arena_bytes None when any activation shape is dynamic.

    Host-side values (sequences, optionals, strings) and network outputs live outside the arena."""
    sizes = {}
    for name in born:
        t = net.tensors.get(name)
        if name in keep or (t is not None and (t.kind != "tensor" or t.dtype is DType.STRING)):
            continue
        if t is None or not t.is_static:
            return
        n = t.dtype.itemsize
        for d in t.shape:
            n *= d
        sizes[name] = -(-n // ALIGN) * ALIGN
    producer = {o: layer.name for layer in net.layers for o in layer.outputs if o}
    placeable = {n for n in sizes if producer[n] in placed and sizes[n] > 0}
    plan.unplaced = len(sizes) - len(placeable)
    occupied: list[tuple[int, int, int, int]] = []  # (start, end, offset, size)
    top = 0
    for name in sorted(placeable, key=lambda n: (born[n], -sizes[n])):
        s, e, size = born[name], end[name], sizes[name]
        busy = sorted((o, o + z) for (bs, be, o, z) in occupied if not (be < s or bs > e))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        occupied.append((s, e, offset, size))
        plan.offsets[name], plan.sizes[name] = offset, size
        top = max(top, offset + size)
    plan.arena_bytes = top
