"""The tactic registry: for each layer kind, the implementations that may run it and their configs.

A tactic says whether it can run a layer on a device (`supports` returns None, or the reason it
cannot), which configurations to try at an optimization level, and compiles one configuration into a
kernel: a callable from the layer's input values to its output values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from kiln.errors import InternalError
from kiln.target import hardware_compat
from kiln.tactics.spec import LayerSpec

Kernel = Callable[[list[Any]], list[Any]]
Config = dict[str, Any]


@dataclass(frozen=True)
class Tactic:
    """One implementation of some layer kinds. Lower `priority` wins when nothing is timed (opt level 0).

    `arch_specific`: uses instructions of one GPU architecture (fp8, TMA, wgmma-only); `card_specific`: its
    configurations are sized by this card (SM count, L2). `--hardware-compat` builds leave such tactics out.
    `writes_out`: its kernels take `out`, one byte buffer (or None) per output, and write the outputs there (the
    activation arena); `fresh`: its outputs never alias its inputs (true of every tactic that writes_out);
    `plans_per_shape`: its library makes a plan at each new input shape on the host (cuDNN: milliseconds a layer), so
    a dynamic engine's warm-up runs every shape of a small profile (`Engine.warm_up`); `superseded_by`: tactics that,
    where they take the layer, have always beaten this one on measured models, so below opt level 4 (EXHAUSTIVE) the
    autotuner leaves it out there (its Hopper successor: fewer compiles per build); `superseded_when`: the layers
    where that holds (default: all).
    """

    name: str
    kinds: tuple[str, ...]
    compile: Callable[[LayerSpec, Config, Any], Kernel]
    supports: Callable[[LayerSpec, Any], str | None] = lambda spec, device: None
    configs: Callable[[LayerSpec, Any, int], list[Config]] = lambda spec, device, level: [{}]
    priority: int = 50
    backends: tuple[str, ...] = ("cuda",)
    untimed: bool = False  # costs no device time (a view): taken without timing when it supports the layer
    arch_specific: bool = False
    card_specific: bool = False
    writes_out: bool = False
    fresh: bool = False
    plans_per_shape: bool = False
    superseded_by: tuple[str, ...] = ()
    superseded_when: Callable[[LayerSpec], bool] = lambda spec: True


TACTICS: dict[str, Tactic] = {}
BY_KIND: dict[str, list[Tactic]] = {}


def register(tactic: Tactic) -> Tactic:
    if tactic.name in TACTICS:
        raise InternalError(f"tactic {tactic.name!r} registered twice")
    TACTICS[tactic.name] = tactic
    for k in tactic.kinds:
        BY_KIND.setdefault(k, []).append(tactic)
    return tactic


def register_table(kind: str, table: Iterable[Tactic]) -> tuple[Tactic, ...]:
    """Register the tactics of one layer kind in the table's order, which breaks ties between equal priorities (the
    quantized kinds: tactics/quant_*.py). A tactic serving several kinds is one object, listed in each of their
    tables: the first table to list it registers it, the others add it to their kind. Every kind a listed tactic
    names must list it (tests/tactics/test_quant_tactic_table.py checks that)."""
    table = tuple(table)
    for tactic in table:
        if kind not in tactic.kinds:
            raise InternalError(f"tactic {tactic.name!r} listed for {kind!r}, which it does not run")
        if TACTICS.setdefault(tactic.name, tactic) is not tactic or any(t is tactic for t in BY_KIND.get(kind, ())):
            raise InternalError(f"tactic {tactic.name!r} registered twice")
        BY_KIND.setdefault(kind, []).append(tactic)
    return table


def get(name: str) -> Tactic:
    _load()
    try:
        return TACTICS[name]
    except KeyError:
        raise InternalError(f"no tactic named {name!r}") from None


def candidates(spec: LayerSpec, device) -> tuple[list[Tactic], list[tuple[str, str]]]:
    """(tactics that can run `spec` on `device`, best first by priority; [(tactic, reason)] of those that cannot)."""
    _load()
    ok, refused = [], []
    for t in BY_KIND.get(spec.kind, []) + BY_KIND.get("*", []):
        if device.backend not in t.backends:
            continue
        reason = hardware_compat.tactic_reason(t, device) or t.supports(spec, device)
        (refused.append((t.name, reason)) if reason else ok.append(t))
    return sorted(ok, key=lambda t: t.priority), refused


EXHAUSTIVE = 4  # the opt level from which superseded tactics are tried too


def untried(cands: list[Tactic], level: int, spec: LayerSpec) -> list[tuple[Tactic, str]]:
    """(tactic, why) of those of `cands` the autotuner leaves out at `level` for layer `spec`: superseded by another
    of `cands`."""
    names = {t.name for t in cands}
    return [] if level >= EXHAUSTIVE else [
        (t, f"superseded by {', '.join(sorted(names & set(t.superseded_by)))} on this device "
            f"(tried from opt level {EXHAUSTIVE})") for t in cands
        if names & set(t.superseded_by) and t.superseded_when(spec)]


def _load() -> None:
    """Import the tactic modules (they register themselves) on first use."""
    from kiln.tactics import library  # noqa: F401


def reference_kernel(spec: LayerSpec) -> Kernel:
    """The layer's reference, with TF32 only where the build asked for it (torch enables it for cuDNN by default;
    CUDA inputs only: the flags mean nothing to the CPU)."""
    from kiln.kinds import run_reference
    from kiln.tactics.common import tf32

    kind, attrs, allow = spec.kind, spec.attrs, spec.tf32

    def run(inputs):
        if not any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs):
            return run_reference(kind, inputs, attrs)
        with tf32(allow):
            return run_reference(kind, inputs, attrs)

    return run


REFERENCE = "reference"


def _compile_reference(spec: LayerSpec, config: Config, device) -> Kernel:
    return reference_kernel(spec)


register(Tactic(REFERENCE, ("*",), _compile_reference, priority=100, backends=("cpu", "cuda")))


def no_grad(kernel: Kernel) -> Kernel:
    def run(inputs):
        with torch.no_grad():
            return kernel(inputs)

    return run
