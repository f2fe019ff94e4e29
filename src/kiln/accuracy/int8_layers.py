"""`debug precision --precision int8`: each quantizable layer's output error when it alone runs int8 (every other
layer float), worst first, then the layers to keep float so that the int8 build passes.

Calibration runs once, in the first (all-int8) build, which writes a calibration cache that every later build reads
(with smooth_alpha, which no cache can hold, each build recalibrates on the same data: same scales, more time).
Each candidate set costs one `kiln.build` with `--layer-precision NAME=fp32` pins, judged against the fp32 build on
the evaluation data (the calibration data unless inputs are given). The search is bisect.py's, over the layers
ordered worst first (its first bisection is --accuracy's shortest worst-first prefix, quant/budget.py); linear
pins the next worst layer until the outputs pass. max-rel and top1-agreement are budget.py's metrics.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

import kiln
from kiln.accuracy.bisect import PrecisionSearch, SearchResult, bisect_layers
from kiln.accuracy.metrics import Metrics, Tolerance
from kiln.errors import ConfigError, KilnError
from kiln.quant.budget import AccuracyBudget, validation_batches

MAX_REL, TOP1 = AccuracyBudget("max-rel", math.inf), AccuracyBudget("top1-agreement", 0.0)


@dataclass
class LayerError:
    """The outputs' error with `name` alone in int8: worst cosine and max-rel over the outputs, first output's top-1."""

    name: str
    kind: str
    cosine: float
    max_rel: float
    top1: float | None
    ratio: float
    passed: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Int8Report:
    """Per-layer errors (worst first), the all-int8 build's, and the search for layers to keep float."""

    layers: list[LayerError]
    all_int8: LayerError
    search: SearchResult
    scales_from: str
    calibrations: int
    samples: int


def as_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    return value


class Int8Search(PrecisionSearch):
    """PrecisionSearch over batches of evaluation data (outputs concatenated along axis 0), no intermediates kept."""

    def __init__(self, model: Path, config: kiln.BuildConfig, fp32: kiln.Engine, batches: list[dict],
                 tol: Tolerance, log: Callable[[str], None] = lambda line: None):
        self.model, self.config, self.batches, self.tol, self.log = model, config, batches, tol, log
        self.ref_net = fp32.network
        self.reference = self.outputs(fp32)
        self.verdicts: dict[frozenset[str], dict[str, Metrics]] = {}
        self.builds: list[tuple[list[str], bool]] = []
        self.engines: dict[frozenset[str], dict] = {}  # pinned set → its build's int8 record
        self.values: dict[frozenset[str], dict[str, Any]] = {}  # pinned set → its outputs

    def outputs(self, engine: kiln.Engine) -> dict[str, Any]:
        ctx = engine.create_context()
        runs = [{n: as_numpy(v) for n, v in ctx.run(feeds).items()} for feeds in self.batches]
        return {n: np.concatenate([r[n] for r in runs]) if np.ndim(runs[0][n]) else runs[0][n] for n in runs[0]}

    def run(self, pinned: list[str], keep: bool = False) -> tuple[kiln.Engine, dict[str, Any]]:
        engine = kiln.build(self.model, dataclasses.replace(
            self.config, layer_precisions={**self.config.layer_precisions, **{n: "fp32" for n in pinned}}))
        values = self.outputs(engine)
        self.engines[frozenset(pinned)] = engine.build_info.get("int8", {})
        self.values[frozenset(pinned)] = values
        return engine, values

    def error(self, name: str, kind: str, pinned: list[str]) -> LayerError:
        """The error of the build with `pinned` in float (built and judged on first use)."""
        self.passes(pinned)
        metrics = self.verdicts[frozenset(pinned)]
        floats = [n for n in self.ref_net.outputs if np.asarray(self.reference[n]).dtype.kind == "f"]
        want, got = ([[torch.from_numpy(np.asarray(v[n], dtype=np.float64)) for n in floats]]
                     for v in (self.reference, self.values[frozenset(pinned)]))
        first = want[0][0] if want[0] else None
        top1 = TOP1.measure(want, got) if first is not None and first.dim() >= 2 and first.shape[-1] > 1 else None
        return LayerError(name, kind, min(m.cosine for m in metrics.values()),
                          MAX_REL.measure(want, got) if want[0] else math.nan, top1,
                          max(m.ratio for m in metrics.values()), all(m.passed for m in metrics.values()))


def evaluation_batches(fp32: kiln.Engine, source: Any, feeds: Mapping[str, Any] | None, batch: int) -> list[dict]:
    """The given feeds as one batch, else the calibration data in batches the fp32 engine takes (as numpy)."""
    if feeds is not None:
        return [dict(feeds)]
    return [{n: as_numpy(v) for n, v in b.items()}
            for b in validation_batches(fp32.network, source, batch, torch.device("cpu"))]


def int8_layer_errors(model: Path, config: kiln.BuildConfig, fp32: kiln.Engine, tol: Tolerance,
                      feeds: Mapping[str, Any] | None = None, mode: str = "bisect",
                      log: Callable[[str], None] = lambda line: None) -> Int8Report:
    """Per-layer int8 errors of `model` under `config` (int8, with calib data) against `fp32`, and the search."""
    if not config.int8 or config.calib is None:
        raise ConfigError("the int8 mode needs calibration data: give --calib DATA (a .npz or a folder of NAME.npy)")
    batches = evaluation_batches(fp32, config.calib, feeds, config.calib_batch)
    samples = sum(next(iter(b.values())).shape[0] if np.ndim(next(iter(b.values()))) else 1 for b in batches)
    with tempfile.TemporaryDirectory(prefix="kiln-debug-int8-") as tmp:
        if not config.smooth_alpha:
            config = dataclasses.replace(config, calib_cache=str(Path(tmp) / "calib.json"))
        search = Int8Search(model, config, fp32, batches, tol, log)
        log("building all-int8 (calibrating once) ...")
        search.passes([])
        record = search.engines[frozenset()]
        quantized = {n: r["kind"] for n, r in record.get("layers", {}).items() if r["precision"] != "float"}
        if not quantized:
            why = "; ".join(f"{n}: {r['reason']}" for n, r in list(record.get("layers", {}).items())[:3])
            why = why or "no Conv, MatMul or Gemm with a constant weight"
            raise KilnError(f"no layer of {model.name} runs int8 ({why}); nothing to debug")
        cands = list(quantized)
        errors = []
        for i, name in enumerate(cands):
            log(f"layer {i + 1}/{len(cands)}: {name} alone in int8")
            errors.append(search.error(name, quantized[name], [c for c in cands if c != name]))
        errors.sort(key=lambda e: (-e.ratio, e.cosine, -e.max_rel))
        all_int8 = search.error("(all int8)", "", [])
        pinned = _search(search, [e.name for e in errors], mode, tol) if not all_int8.passed else []
        calibrations = sum(r.get("scales_from", "").startswith("calibrated") for r in search.engines.values())
    order = {name: i for i, name in enumerate(cands)}
    result = SearchResult(sorted(pinned, key=order.get), cands, search.builds, search.verdicts[frozenset(pinned)])
    scales_from = record.get("scales_from", "").split("; written to calibration cache")[0]  # a temporary file
    return Int8Report(errors, all_int8, result, scales_from, calibrations, samples)


def _search(search: Int8Search, worst_first: Sequence[str], mode: str, tol: Tolerance) -> list[str]:
    """Layers to keep float: bisect.py's bisection over the worst-first order, or (linear) the next worst until pass."""
    if not search.passes(list(worst_first)):
        raise KilnError(f"the outputs fail ({tol}) even with all {len(worst_first)} int8 layers in float; the error "
                        "is not the layers' precision: loosen the tolerance or check the inputs")
    if mode == "bisect":
        return bisect_layers(search, list(worst_first))
    return next(list(worst_first[:k]) for k in range(1, len(worst_first) + 1) if search.passes(list(worst_first[:k])))
