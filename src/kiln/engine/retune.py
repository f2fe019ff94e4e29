"""Re-tune a plan for the device it is loaded on: the plan holds the optimized, precision-assigned network,
so only the autotuner runs again (reading and filling the timing cache), within the plan's compat class."""

from __future__ import annotations

import dataclasses
import time

from kiln.builder.autotune import tune
from kiln.tactics.choice import Choice
from kiln.target.device import Device
from kiln.builder.timing_cache import TimingCache
from kiln.config import BuildConfig
from kiln.ir import Network
from kiln.kinds.interpret import to_device


def retune(network: Network, config: BuildConfig, device: Device, old: dict[str, Choice],
           timing_cache: str | None = None, progress=None) -> tuple[dict[str, Choice], dict]:
    """(new tactic choice per layer, a record of the re-tune for the plan's build info)."""
    start = time.perf_counter()
    target = dataclasses.replace(device, hardware_compat=config.hardware_compat)
    cache = TimingCache(timing_cache) if timing_cache and device.backend == "cuda" else None
    weights = {k: to_device(v, device.torch_device) for k, v in network.constants.items()}
    choices = tune(network, weights, target, config.opt_level, config.tf32, cache, progress or (lambda *a: None),
                   config.workspace_bytes)
    changed = sum(1 for name, c in choices.items()
                  if name not in old or (old[name].tactic, old[name].config) != (c.tactic, c.config))
    info = {"device": device.name, "seconds": time.perf_counter() - start, "layers": len(choices),
            "changed": changed}
    if cache is not None:
        info["timing_cache"] = {"path": str(cache.path), "hits": cache.hits, "misses": cache.misses}
    return choices, info
