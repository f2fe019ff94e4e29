"""What --fp8 asks of a build before it starts: activation ranges to calibrate from, and on CUDA a GPU with fp8
tensor cores (compute capability 8.9: Ada, Hopper and later) in a plan class that holds only such GPUs."""

from __future__ import annotations

import torch

from kiln.config import BuildConfig
from kiln.errors import ConfigError
from kiln.quant.int8_stage import NO_SCALES

MIN_CC = (8, 9)


def check_fp8(config: BuildConfig, device, calib_data=None, capability: tuple[int, int] | None = None) -> None:
    """ConfigError when an --fp8 build cannot quantize or cannot run fp8 on `device` (`capability`: its compute
    capability, read from the device when not given)."""
    if not config.fp8:
        return
    if config.calib is None and config.calib_cache is None and calib_data is None:
        raise ConfigError(f"--fp8 needs activation ranges: {NO_SCALES}")
    if device.backend != "cuda":
        return  # the CPU backend runs fp8 layers through their references
    cc = tuple(capability or torch.cuda.get_device_capability(device.torch_device))
    if cc < MIN_CC:
        raise ConfigError(f"--fp8 needs a GPU of compute capability {MIN_CC[0]}.{MIN_CC[1]} or later (fp8 tensor "
                          f"cores: Ada, Hopper); {device.name} has {cc[0]}.{cc[1]}. Build with --int8 instead")
    if getattr(device, "hardware_compat", "none") == "portable":
        raise ConfigError("--fp8 with --hardware-compat portable: portable plans run on every GPU from sm80 on, "
                          "which lack fp8 tensor cores; use --hardware-compat same-cc (or none), or --int8")
