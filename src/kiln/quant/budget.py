"""--accuracy "cosine>=0.995": keep the most sensitive quantized layers in float until the int8 network meets the
budget on validation data.

Metrics, int8 network vs the float network on the same validation samples, over every float output:
  cosine          mean over samples (axis 0) of the cosine of each sample's flattened output; the worst output
  max-rel         max |int8 − float| ÷ max |float| per output; the worst output
  top1-agreement  share of rows whose argmax over the last axis agrees, on the first output
Search: measure the all-int8 network; if it misses the budget, measure each quantized layer's sensitivity as the
metric of the all-int8 network with only that layer in float, then return layers to float, most sensitive first:
the shortest such prefix that meets the budget, found by bisection. \
Networks run on the reference executor (layers left float in fp32: the search measures the
int8 error only).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kiln.errors import ConfigError, InputError
from kiln.quant.calibrators import CALIBRATORS
from kiln.ir import Network
from kiln.kinds.interpret import run_network
from kiln.quant.batching import fitted
from kiln.quant.calibrate import batch_feeds, calibration_data
from kiln.kinds.qtype import INT8, QType
from kiln.quant.int8 import apply_int8
from kiln.quant.scheme import QuantScales
from kiln.util.timing import measure

METRICS = {"cosine": ">=", "max-rel": "<=", "top1-agreement": ">="}
MAX_VALIDATION_BATCHES = 64


@dataclass(frozen=True)
class AccuracyBudget:
    """One bound on one metric: `metric op bound`."""

    metric: str
    bound: float

    @classmethod
    def parse(cls, text: str) -> "AccuracyBudget":
        m = re.fullmatch(r"\s*([a-z0-9-]+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*", text or "")
        if not m or m.group(1) not in METRICS or METRICS[m.group(1)] != m.group(2):
            raise ConfigError(f"--accuracy {text!r} is not a budget kiln knows; write one of "
                              + ", ".join(f"'{k}{op}X'" for k, op in METRICS.items()) + " (e.g. 'cosine>=0.995')")
        try:
            bound = float(m.group(3))
        except ValueError:
            raise ConfigError(f"--accuracy {text!r}: {m.group(3)!r} is not a number") from None
        return cls(m.group(1), bound)

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric] == ">="

    def holds(self, value: float) -> bool:
        return value >= self.bound if self.higher_is_better else value <= self.bound

    def __str__(self) -> str:
        return f"{self.metric}{METRICS[self.metric]}{self.bound:g}"

    def measure(self, want: list[list[torch.Tensor]], got: list[list[torch.Tensor]]) -> float:
        """The metric over batches (outer list) of outputs (inner list)."""
        def rows(t: torch.Tensor) -> torch.Tensor:
            t = t.detach().double().cpu()
            return t.reshape(t.shape[0], -1) if t.dim() else t.reshape(1, 1)

        if self.metric == "top1-agreement":
            r, g = (torch.cat([b[0].detach().cpu().reshape(-1, b[0].shape[-1]) for b in x]) for x in (want, got))
            return (r.argmax(-1) == g.argmax(-1)).double().mean().item()
        per_output = []
        for k, w in enumerate(want[0]):
            if not (isinstance(w, torch.Tensor) and w.is_floating_point()):
                continue
            r, g = torch.cat([rows(b[k]) for b in want]), torch.cat([rows(b[k]) for b in got])
            if self.metric == "cosine":
                per_output.append(torch.nn.functional.cosine_similarity(g, r, dim=1, eps=1e-30).mean().item())
            else:
                per_output.append(((g - r).abs().max() / r.abs().max().clamp(min=1e-30)).item())
        return min(per_output) if self.higher_is_better else max(per_output)


def validation_batches(net: Network, source: Any, batch: int, device) -> list[dict[str, torch.Tensor]]:
    """The validation data as device feeds (at most MAX_VALIDATION_BATCHES batches)."""
    data = calibration_data(source, list(net.inputs), batch)
    out = []
    for feeds in fitted(net, (batch_feeds(net, b, device) for b in data.batches), "validation"):
        out.append(feeds)
        if len(out) >= MAX_VALIDATION_BATCHES:
            break
    if not out:
        raise InputError("the --validation data holds no samples; give at least one batch")
    return out


def copy_network(net: Network) -> Network:
    """A copy of `net` sharing its constant tensors (the int8 rewrite adds constants, never edits them)."""
    return copy.deepcopy(net, memo={id(v): v for v in net.constants.values()})


class Search:
    """Runs the float network once and quantized variants of it (`keep` in float) on the validation feeds."""

    def __init__(self, net: Network, scales: QuantScales, budget: AccuracyBudget, feeds: list[dict], device,
                 pinned: set[str], qtype: QType = INT8):
        self.net, self.scales, self.budget, self.feeds, self.device = net, scales, budget, feeds, device
        self.qtype = qtype
        self.pinned = set(pinned)
        self.want = self.run(net)
        self.runs = 0

    def run(self, net: Network) -> list[list[torch.Tensor]]:
        with torch.no_grad():
            return [[o.float() if isinstance(o, torch.Tensor) and o.is_floating_point() else o
                     for o in run_network(net, [f[n] for n in net.inputs], self.device)] for f in self.feeds]

    def value(self, keep: set[str]) -> tuple[float, list[str]]:
        """The metric with the layers in `keep` (and the pinned ones) float; the layers that ran quantized."""
        net = copy_network(self.net)
        result = apply_int8(net, self.scales, keep | self.pinned, self.qtype)
        self.runs += 1
        return self.budget.measure(self.want, self.run(net)), result.quantized


def search(net: Network, scales: QuantScales, budget: AccuracyBudget, feeds: list[dict], device,
           pinned: set[str] = frozenset(), progress: Callable[[str], None] = lambda s: None,
           qtype: QType = INT8) -> tuple[set[str], dict]:
    """(layers to keep float, the record for build info / inspect); the quantized layers are of `qtype`."""
    s = Search(net, scales, budget, feeds, device, pinned, qtype)
    all_int8, layers = s.value(set())
    record = {"budget": str(budget), "samples": sum(next(iter(f.values())).shape[0] for f in feeds),
              "all_int8": all_int8, "fallbacks": [], "sensitivity": {}}
    if budget.holds(all_int8) or not layers:
        record |= {"achieved": all_int8, "met": budget.holds(all_int8)}
        return set(), record
    for i, name in enumerate(layers):
        progress(f"sensitivity {i + 1}/{len(layers)}")
        record["sensitivity"][name] = s.value({name})[0]
    sign = -1 if budget.higher_is_better else 1
    order = sorted(layers, key=lambda n: sign * record["sensitivity"][n])
    # the shortest prefix of `order` that meets the budget, by bisection (the metric is taken to improve as
    # layers return to float); the full prefix is every quantizable layer float
    values = {len(order): s.value(set(order))[0]}
    lo, hi = 0, len(order)
    while budget.holds(values[hi]) and hi - lo > 1:
        mid = (lo + hi) // 2
        values[mid] = s.value(set(order[:mid]))[0]
        lo, hi = (lo, mid) if budget.holds(values[mid]) else (mid, hi)
    record["fallbacks"] = order[:hi]
    record |= {"achieved": values[hi], "met": budget.holds(values[hi]), "evaluations": s.runs}
    return set(order[:hi]), record


def time_engines(engines: dict[str, Any], repeats: int = 20) -> dict:
    """Median CUDA-event milliseconds of one run of each engine (same random inputs; static shapes), and the
    chosen engine's cost over the all-int8 one."""
    first = next(iter(engines.values()))
    g = torch.Generator().manual_seed(0)
    feeds = {t.name: (torch.randn(t.shape, generator=g) if t.dtype.is_float else torch.zeros(t.shape))
             .to(t.dtype.torch).to(first.device.torch_device) for t in first.inputs}
    out = {}
    for name, engine in engines.items():
        ctx = engine.create_context()
        out[f"{name}_ms"] = measure(lambda: ctx.run(feeds), device="cuda", warmup=3, iterations=repeats).median
    if "chosen_ms" in out and "all_int8_ms" in out:
        out["fallback_cost_ms"] = out["chosen_ms"] - out["all_int8_ms"]
    return out


def check_quant_options(config) -> None:
    """The build config's quantization options that name quant's own tables: the calibrator and the budget grammar
    (checked here, at the start of a build, so that config depends on nothing above it)."""
    if config.calibrator not in CALIBRATORS:
        raise ConfigError(f"unknown calibrator {config.calibrator!r}; choose one of {', '.join(CALIBRATORS)}")
    if config.accuracy is not None:
        AccuracyBudget.parse(config.accuracy)
