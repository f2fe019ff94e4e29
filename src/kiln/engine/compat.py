"""Does a plan's recorded device and software match the machine loading it? Policy decides what follows."""

from __future__ import annotations

import enum
import warnings

import torch

from kiln.builder.device import Device, detect
from kiln.errors import EngineCompatibilityError


class Policy(enum.Enum):
    STRICT = "strict"   # refuse any difference
    WARN = "warn"       # run, saying what differs


def check(header: dict, policy: Policy | str = Policy.STRICT, source: str = "plan") -> Device:
    """Return the device to run on, or raise EngineCompatibilityError naming each difference."""
    policy = Policy(policy)
    built = header.get("device") or {}
    backend = built.get("backend")
    if backend == "cuda" and not torch.cuda.is_available():
        raise EngineCompatibilityError(
            f"{source} was built for GPU {built.get('name')!r} but this machine has no CUDA GPU; "
            "rebuild it here with `kiln build MODEL.onnx --device cpu`")
    if backend not in ("cpu", "cuda"):
        raise EngineCompatibilityError(f"{source} names an unknown backend {backend!r}; rebuild it")
    device = detect(backend)
    here = device.fingerprint()
    keys = ("name", "cc", "kiln", "torch", "cuda") if backend == "cuda" else ("kiln", "torch")
    diffs = [f"{k}: built with {built.get(k)!r}, running {here.get(k)!r}" for k in keys if built.get(k) != here.get(k)]
    if diffs:
        msg = (f"{source} does not match this machine ({'; '.join(diffs)}); rebuild it here with "
               "`kiln build MODEL.onnx -o PLAN`, or load with policy 'warn' to run it anyway")
        if policy is Policy.STRICT:
            raise EngineCompatibilityError(msg)
        warnings.warn(msg, stacklevel=3)
    return device
