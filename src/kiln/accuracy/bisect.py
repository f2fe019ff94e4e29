"""`debug precision`: find a small set of layers that must stay fp32 for a reduced-precision build to pass.

The fp32 reference (outputs and every intermediate) is computed once; each candidate set costs one build.
bisect: the smallest prefix of the layers (in run order) whose pinning passes names one needed layer, the
last of the prefix; pin it and search again before it, until the outputs pass (about log2(n) builds per layer).
linear: build, find the layers that introduce error (an output beyond tolerance from inputs within it), pin the
worst, repeat (one build per pinned layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import kiln
from kiln.accuracy.compare import compare_values, layer_outputs
from kiln.accuracy.metrics import Metrics, Tolerance
from kiln.errors import KilnError

MODES = ("bisect", "linear")


@dataclass
class SearchResult:
    """The layers to keep in fp32 (run order), the layers that were candidates, and each build's verdict."""

    layers: list[str]
    candidates: list[str]
    builds: list[tuple[list[str], bool]] = field(default_factory=list)
    outputs: dict[str, Metrics] = field(default_factory=dict)

    def flags(self) -> list[str]:
        return [f"--layer-precision {name}=fp32" for name in self.layers]


class PrecisionSearch:
    """Builds of `model` under `config` with candidate layer sets pinned to fp32, judged against the fp32 engine's
    outputs and intermediates, computed once."""

    def __init__(self, model: Path, config: kiln.BuildConfig, fp32: kiln.Engine, feeds: Mapping[str, Any],
                 tol: Tolerance, log: Callable[[str], None] = lambda line: None):
        self.model, self.config, self.feeds, self.tol, self.log = model, config, feeds, tol, log
        self.ref_net = fp32.network
        self.reference = fp32.create_context().run(feeds, keep=layer_outputs(fp32.network))
        self.verdicts: dict[frozenset[str], dict[str, Metrics]] = {}  # pinned set → its outputs' metrics
        self.builds: list[tuple[list[str], bool]] = []

    def run(self, pinned: list[str], keep: bool = False) -> tuple[kiln.Engine, dict[str, Any]]:
        """Build with `pinned` in fp32 and run it (with every reference tensor kept when `keep`)."""
        engine = kiln.build(self.model, dataclasses.replace(
            self.config, layer_precisions={**self.config.layer_precisions, **{n: "fp32" for n in pinned}}))
        names = (layer_outputs(engine.network) & set(self.reference)) if keep else set()
        return engine, engine.create_context().run(self.feeds, keep=names - set(engine.network.outputs))

    def metrics(self, values: Mapping[str, Any]) -> dict[str, Metrics]:
        return compare_values(self.reference, values, lambda name: self.tol)

    def record(self, pinned: list[str], values: Mapping[str, Any]) -> bool:
        """Whether the outputs pass; their metrics remembered per set, the verdict logged."""
        outputs = {n: m for n, m in self.metrics(values).items() if n.partition("[")[0] in self.ref_net.outputs}
        self.verdicts[frozenset(pinned)] = outputs
        ok = all(m.passed for m in outputs.values())
        self.builds.append((list(pinned), ok))
        self.log(f"build {len(self.builds)}: {len(pinned)} layer(s) in fp32 → {'PASS' if ok else 'FAIL'}")
        return ok

    def passes(self, pinned: list[str]) -> bool:
        key = frozenset(pinned)
        if key not in self.verdicts:
            return self.record(pinned, self.run(pinned)[1])
        return all(m.passed for m in self.verdicts[key].values())


def candidates(engine: kiln.Engine) -> list[str]:
    """Layers the build runs in reduced precision, in run order: the ones pinning can change."""
    return [layer.name for layer in engine.network.layers if layer.precision is not None]


def find_fp32_layers(model: Path, config: kiln.BuildConfig, fp32: kiln.Engine, feeds: Mapping[str, Any],
                     tol: Tolerance, mode: str = "bisect", log: Callable[[str], None] = lambda line: None
                     ) -> SearchResult:
    """A small set of layers whose fp32 pinning makes `config`'s build pass `tol` against `fp32` (the model built
    without reduced precision) on `feeds`."""
    search = PrecisionSearch(model, config, fp32, feeds, tol, log)
    engine, values = search.run([], keep=mode == "linear")
    cands = candidates(engine)
    if search.record([], values):
        pinned = []
    elif not search.passes(cands):
        raise KilnError(f"the outputs fail ({tol}) even with all {len(cands)} reduced layers in fp32; the error "
                        "is not the layers' precision: loosen the tolerance or check the inputs")
    else:
        pinned = bisect_layers(search, cands) if mode == "bisect" else _linear(search, cands, values)
    order = {name: i for i, name in enumerate(cands)}
    return SearchResult(sorted(pinned, key=order.get), cands, search.builds, search.verdicts[frozenset(pinned)])


def bisect_layers(search: PrecisionSearch, cands: list[str]) -> list[str]:
    """Layers of `cands` to pin, the last of each smallest passing prefix (int8 mode orders them worst first).
    Invariant: pinning `pinned` + cands[:hi] passes; the last layer of the smallest passing prefix is needed."""
    pinned: list[str] = []
    hi = len(cands)
    while not search.passes(pinned):
        lo = 0  # pinning `pinned` + cands[:lo] fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if search.passes(pinned + cands[:mid]):
                hi = mid
            else:
                lo = mid
        pinned.append(cands[hi - 1])
        hi -= 1
    return pinned


def _linear(search: PrecisionSearch, cands: list[str], values: Mapping[str, Any]) -> list[str]:
    """Pin the layer that introduces the most error, rebuild, until the outputs pass."""
    pinned: list[str] = []
    while True:
        worst = _worst_layer(search, [c for c in cands if c not in pinned], search.metrics(values))
        if worst is None:
            raise KilnError("no remaining reduced-precision layer has an output beyond tolerance, yet the outputs "
                            "fail; try --mode bisect")
        pinned.append(worst)
        values = search.run(pinned, keep=True)[1]
        if search.record(pinned, values):
            return pinned


def _worst_layer(search: PrecisionSearch, cands: list[str], metrics: Mapping[str, Metrics]) -> str | None:
    """Of the candidates whose output fails, the worst among those whose inputs pass (those that add the error)."""
    layers = {layer.name: layer for layer in search.ref_net.layers}
    ratio = lambda names: max((metrics[n].ratio for n in names if n in metrics), default=0.0)  # noqa: E731
    failing = [(ratio(layers[c].outputs), ratio(layers[c].inputs), c) for c in cands
               if c in layers and ratio(layers[c].outputs) > 1]
    adding = [f for f in failing if f[1] <= 1] or failing
    return max(adding, key=lambda f: f[0])[2] if adding else None
