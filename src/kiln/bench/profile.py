"""Per-layer timing: each layer's kernel timed on its own over several passes of the engine.

A separate run from the headline measurement: timing each layer adds a clock read (or two CUDA events)
per layer and runs eagerly, without the CUDA graph. On CUDA each layer is queued behind a GPU spin
(the autotuner's LAUNCH_COVER_CYCLES), so its events see the kernels' device time, not the host's launch
cost, which a graph replay never pays; the sum then comes close to the engine's latency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from kiln.builder.autotune import LAUNCH_COVER_CYCLES
from kiln.errors import ConfigError
from kiln.runtime.context import to_device
from kiln.runtime.io import as_torch


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


def profile_layers(engine, feeds: Mapping[str, Any], iterations: int = 20, warmup: int = 2) -> LayerProfile:
    """Time each of `engine`'s layer kernels over `iterations` passes (after `warmup` untimed ones) on `feeds`
    (numpy, torch or DLPack tensors, as `ctx.run` takes)."""
    if iterations < 1:
        raise ConfigError(f"the profile needs at least 1 iteration, got {iterations}")
    dev = engine.device.torch_device
    inputs = {k: to_device(as_torch(k, v)[0], dev) for k, v in feeds.items()}
    clock = _CudaClock(len(engine.kernels)) if engine.device.backend == "cuda" else _CpuClock(len(engine.kernels))
    with torch.inference_mode():
        for _ in range(warmup):
            _one_pass(engine, inputs, lambda step, kernel, args: kernel(args))
        for _ in range(iterations):
            _one_pass(engine, inputs, clock.time)
    net = engine.network
    rows = tuple(LayerTime(layer.name, layer.kind, _precision(net, layer), engine.tactics[layer.name].tactic, ms)
                 for layer, ms in zip(net.layers, clock.results_ms()))
    return LayerProfile(rows, iterations, engine.device.name)


def _one_pass(engine, inputs: dict[str, Any], call: Callable[[int, Callable, list], list]) -> None:
    """The executor's loop (runtime.context.run_layers) with each kernel call going through `call`."""
    values: dict[str, Any] = dict(engine.weights)
    values.update(inputs)
    release = engine.memory_plan.release
    for step, layer in enumerate(engine.network.layers):
        outs = call(step, engine.kernels[step], [values[n] if n else None for n in layer.inputs])
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


class _CpuClock:
    """perf_counter around each kernel call (the CPU backend runs synchronously)."""

    def __init__(self, layers: int):
        self.ms: list[list[float]] = [[] for _ in range(layers)]

    def time(self, step: int, kernel: Callable, args: list) -> list:
        start = time.perf_counter()
        outs = kernel(args)
        self.ms[step].append((time.perf_counter() - start) * 1e3)
        return outs

    def results_ms(self) -> list[tuple[float, ...]]:
        return [tuple(ms) for ms in self.ms]


class _CudaClock:
    """CUDA events recorded around each kernel call; read after one synchronize at the end."""

    def __init__(self, layers: int):
        self.events: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in range(layers)]
        torch.cuda.synchronize()

    def time(self, step: int, kernel: Callable, args: list) -> list:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(LAUNCH_COVER_CYCLES)  # the host launches while the GPU spins: device time only
        start.record()
        outs = kernel(args)
        end.record()
        self.events[step].append((start, end))
        return outs

    def results_ms(self) -> list[tuple[float, ...]]:
        torch.cuda.synchronize()
        return [tuple(s.elapsed_time(e) for s, e in pairs) for pairs in self.events]
