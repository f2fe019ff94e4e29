"""Re-tune a plan for the device it is loaded on: the plan holds the optimized, precision-assigned network,
so only the autotuner runs again (reading and filling the timing cache), within the plan's compat class.
Every optimization profile is re-tuned, as the build tunes them (`tune_profiles` at each profile's shapes)."""

from __future__ import annotations

import dataclasses
import time

from kiln.builder.autotune import tune_profiles
from kiln.builder.build import profile_tensor_shapes
from kiln.tactics.choice import Choice
from kiln.target.device import Device
from kiln.builder.timing_cache import TimingCache
from kiln.config import BuildConfig
from kiln.ir import Network
from kiln.kinds.interpret import to_device


def retune(network: Network, config: BuildConfig, device: Device, old: list[dict[str, Choice]],
           timing_cache: str | None = None, progress=None) -> tuple[list[dict[str, Choice]], dict]:
    """(new {layer: Choice} per optimization profile, one at least; a record of the re-tune for the plan's build
    info). `old`: the plan's choices per profile (a layer a profile omits takes profile 0's)."""
    start = time.perf_counter()
    target = dataclasses.replace(device, hardware_compat=config.hardware_compat)
    cache = TimingCache(timing_cache) if timing_cache and device.backend == "cuda" else None
    weights = {k: to_device(v, device.torch_device) for k, v in network.constants.items()}
    shapes = profile_tensor_shapes(network, config, target)
    profiles = tune_profiles(network, weights, target, config.opt_level, config.tf32, cache,
                             progress or (lambda *a: None), config.workspace_bytes, shapes)
    base = old[0] if old else {}
    before = [dict(base, **(old[k] if k < len(old) else {})) for k in range(len(profiles))]
    changed = {name for was, now in zip(before, profiles) for name, c in now.items()
               if name not in was or (was[name].tactic, was[name].config) != (c.tactic, c.config)}
    info = {"device": device.name, "seconds": time.perf_counter() - start, "layers": len(profiles[0]),
            "profiles": len(profiles), "changed": len(changed)}
    if cache is not None:
        info["timing_cache"] = {"path": str(cache.path), "hits": cache.hits, "misses": cache.misses}
    return profiles, info
