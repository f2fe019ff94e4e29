"""The device an engine is built for and runs on, and the fingerprint plans record."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from kiln.errors import ConfigError
from kiln.version import __version__


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _driver_version() -> str | None:
    """The NVIDIA driver version (as nvidia-smi prints it), or None where it cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # pynvml absent or no NVML: fall back to the CUDA driver API version torch reports
        pass
    try:
        import torch

        v = int(torch._C._cuda_getDriverVersion())  # e.g. 12080: the CUDA version the driver supports
        return f"cuda-driver-api {v // 1000}.{v % 1000 // 10}"
    except Exception:
        return None


@dataclass(frozen=True)
class Device:
    """A backend (cpu or cuda) and what identifies it for plan compatibility.

    `hardware_compat` is the class of devices a build targets (see target/hardware_compat.py): tactics
    read it to keep only configurations valid on every device of that class.
    """

    backend: str
    name: str
    torch_device: str
    hardware_compat: str = "none"

    def fingerprint(self) -> dict:
        """What identifies this device and software stack: the plan header records it, loads compare it."""
        import torch  # here, not at import: `kiln --help` must not load torch

        fp = {"backend": self.backend, "name": self.name, "kiln": __version__,
              "torch": torch.__version__.split("+")[0], "triton": _triton_version()}
        if self.backend == "cuda":
            props = torch.cuda.get_device_properties(0)
            fp.update(cc=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                      memory=props.total_memory, cuda=torch.version.cuda, driver=_driver_version())
        return fp


def detect(requested: str = "auto", hardware_compat: str = "none") -> Device:
    """The best device present (`auto`), or the one asked for."""
    import torch

    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise ConfigError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    if requested == "cuda" or (requested == "auto" and has_cuda):
        return Device("cuda", torch.cuda.get_device_name(0), "cuda", hardware_compat)
    return Device("cpu", platform.machine() or "cpu", "cpu", hardware_compat)
