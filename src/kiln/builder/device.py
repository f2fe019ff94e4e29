"""The device an engine is built for and runs on, and the fingerprint plans record."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from kiln.errors import ConfigError
from kiln.version import __version__


@dataclass(frozen=True)
class Device:
    """A backend (cpu or cuda) and what identifies it for plan compatibility."""

    backend: str
    name: str
    torch_device: str

    def fingerprint(self) -> dict:
        fp = {"backend": self.backend, "name": self.name, "kiln": __version__,
              "torch": torch.__version__.split("+")[0]}
        if self.backend == "cuda":
            props = torch.cuda.get_device_properties(0)
            fp.update(cc=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                      memory=props.total_memory, cuda=torch.version.cuda)
        return fp


def detect(requested: str = "auto") -> Device:
    """The best device present (`auto`), or the one asked for."""
    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise ConfigError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    if requested == "cuda" or (requested == "auto" and has_cuda):
        return Device("cuda", torch.cuda.get_device_name(0), "cuda")
    return Device("cpu", platform.machine() or "cpu", "cpu")
