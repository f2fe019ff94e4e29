"""Per-layer timing: each layer's kernel timed on its own over several passes of the engine.

A separate run from the headline measurement: timing each layer adds a clock read (or two CUDA events)
per layer and runs eagerly, without the CUDA graph. On CUDA each layer is queued behind a GPU spin
(kiln.util.timing's LAUNCH_COVER_CYCLES, as the autotuner), so its events see the kernels' device time, not the \
host's launch
cost, which a graph replay never pays; the sum then comes close to the engine's latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from kiln.errors import ConfigError
from kiln.kinds.interpret import to_device
from kiln.runtime.io import as_torch
from kiln.runtime.nvtx import ranged_kernels
from kiln.util.timing import LAUNCH_COVER_CYCLES, clock as make_clock


@dataclass(frozen=True)
class LayerTime:
    """One layer's kernel times (ms), one per profiled pass."""

    name: str
    kind: str
    precision: str
    tactic: str
    times_ms: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.times_ms))

    @property
    def median(self) -> float:
        return float(np.median(self.times_ms))

    @property
    def total(self) -> float:
        """Summed over every profiled pass."""
        return float(np.sum(self.times_ms))


@dataclass(frozen=True)
class LayerProfile:
    """Every layer's times in run order; `ranked()` sorts them by mean time, slowest first."""

    layers: tuple[LayerTime, ...]
    iterations: int
    device: str

    @property
    def total_ms(self) -> float:
        return sum(layer.mean for layer in self.layers)

    def percent(self, ms: float) -> float:
        return 100.0 * ms / self.total_ms if self.total_ms > 0 else 0.0

    def ranked(self) -> list[LayerTime]:
        return sorted(self.layers, key=lambda layer: layer.mean, reverse=True)

    def by_kind(self) -> list[dict]:
        """Mean times summed per (layer kind, tactic), slowest group first: where the time goes."""
        groups: dict[tuple[str, str], list] = {}
        for t in self.layers:
            g = groups.setdefault((t.kind, t.tactic), [0, 0.0])
            g[0] += 1
            g[1] += t.mean
        return [{"kind": k, "tactic": tac, "layers": n, "ms": ms, "percent": self.percent(ms)}
                for (k, tac), (n, ms) in sorted(groups.items(), key=lambda kv: -kv[1][1])]

    def to_json(self) -> dict:
        rows = [{"layer": t.name, "kind": t.kind, "precision": t.precision, "tactic": t.tactic, "time_ms": t.total,
                 "mean_ms": t.mean, "median_ms": t.median, "percent": self.percent(t.mean)} for t in self.ranked()]
        return {"device": self.device, "iterations": self.iterations, "total_ms": self.total_ms,
                "separate_run": True, "layers": rows}


def profile_layers(engine, feeds: Mapping[str, Any], iterations: int = 20, warmup: int = 2,
                   nvtx: bool = False) -> LayerProfile:
    """Time each of `engine`'s layer kernels over `iterations` passes (after `warmup` untimed ones) on `feeds`
    (numpy, torch or DLPack tensors, as `ctx.run` takes); `nvtx`: each kernel call inside an NVTX range named after
    its layer (kiln.runtime.nvtx)."""
    if iterations < 1:
        raise ConfigError(f"the profile needs at least 1 iteration, got {iterations}")
    dev = engine.device.torch_device
    inputs = {k: to_device(as_torch(k, v)[0], dev) for k, v in feeds.items()}
    # on CUDA the host launches each kernel while the GPU spins: device time only
    clock = make_clock(engine.device.backend, len(engine.kernels), LAUNCH_COVER_CYCLES)
    kernels = ranged_kernels(engine) if nvtx else engine.kernels
    with torch.inference_mode():
        for _ in range(warmup):
            _one_pass(engine, kernels, inputs, lambda step, kernel, args: kernel(args))
        for _ in range(iterations):
            _one_pass(engine, kernels, inputs, lambda step, kernel, args: clock.time(kernel, args, slot=step))
    net = engine.network
    rows = tuple(LayerTime(layer.name, layer.kind, _precision(net, layer), engine.tactics[layer.name].tactic, ms)
                 for layer, ms in zip(net.layers, clock.results_ms()))
    return LayerProfile(rows, iterations, engine.device.name)


def _one_pass(engine, kernels: list, inputs: dict[str, Any], call: Callable[[int, Callable, list], list]) -> None:
    """The executor's loop (kiln.kinds.interpret.run_layers) with each kernel call going through `call`."""
    values: dict[str, Any] = dict(engine.weights)
    values.update(inputs)
    release = engine.memory_plan.release
    for step, layer in enumerate(engine.network.layers):
        outs = call(step, kernels[step], [values[n] if n else None for n in layer.inputs])
        for name, value in zip(layer.outputs, outs):
            if name:
                values[name] = value
        for name in release[step] if release else ():
            values.pop(name, None)


def _precision(net, layer) -> str:
    """The layer's compute type: its assigned precision, else the type of its first output."""
    if layer.precision is not None:
        return str(layer.precision)
    first = next((o for o in layer.outputs if o), None)
    return str(net.tensors[first].dtype) if first else "-"
