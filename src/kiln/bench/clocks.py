"""GPU clocks through NVML (pynvml), to tell whether a run was throttled; nothing when NVML is not there."""

from __future__ import annotations

# NVML clock-event reasons that mean the GPU slowed itself down (idle, application clocks and sync boost do not)
_SLOWDOWNS = {0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
              0x40: "hardware thermal slowdown", 0x80: "hardware power brake"}


def read_clocks(device: str) -> dict | None:
    """The SM clock now and its maximum (MHz) and the active slowdown reasons; None without pynvml or a GPU."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        index = torch.cuda._get_nvml_device_index(torch.device(device))
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        sm = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        top = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    except Exception:  # no pynvml, no NVML, or a query it does not support: say nothing rather than guess
        return None
    return {"sm_mhz": int(sm), "max_sm_mhz": int(top),
            "slowdowns": [name for bit, name in _SLOWDOWNS.items() if reasons & bit]}


def throttle_warning(clocks: dict | None) -> str | None:
    """A warning when the SM clock sat below 95 % of its maximum for a slowdown reason at the end of the run."""
    if not clocks or not clocks["slowdowns"] or clocks["sm_mhz"] >= 0.95 * clocks["max_sm_mhz"]:
        return None
    return (f"GPU clocks look throttled: SM clock {clocks['sm_mhz']} MHz of {clocks['max_sm_mhz']} MHz "
            f"({', '.join(clocks['slowdowns'])}); check cooling and power limits (nvidia-smi -q -d PERFORMANCE)")
