"""Liveness-based memory plan: when each activation dies, and arena offsets where shapes are static."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.ir import DType, Network

ALIGN = 256


@dataclass
class MemoryPlan:
    """`release[k]` lists the tensors whose last reader is layer k; offsets/arena_bytes are for static shapes."""

    release: list[list[str]]
    offsets: dict[str, int] = field(default_factory=dict)
    arena_bytes: int | None = None

    def to_json(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "offsets": self.offsets}


def plan_memory(net: Network) -> MemoryPlan:
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
    _assign_offsets(net, plan, born, last, keep)
    return plan


def _assign_offsets(net, plan, born, last, keep) -> None:
    """First-fit offsets over lifetimes; skipped (arena_bytes None) when any activation shape is dynamic.

    Host-side values (sequences, optionals, strings) live outside the arena and take no offset.
    """
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
    placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, size)
    top = 0
    for name in sorted(sizes, key=lambda n: (born[n], -sizes[n])):
        s, e, size = born[name], last[name], sizes[name]
        busy = sorted((o, o + z) for (bs, be, o, z) in placed if not (be < s or bs > e))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((s, e, offset, size))
        plan.offsets[name] = offset
        top = max(top, offset + size)
    plan.arena_bytes = top
