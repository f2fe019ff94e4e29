"""Does a plan's recorded device and software match the machine loading it? Policy decides what follows.

Decided from the header alone, before the payload is parsed. Differences that make a plan wrong or
slow here (another GPU model, other kiln/torch/triton/CUDA versions) block under `strict`; a plan built
`--hardware-compat same-cc` or `portable` loads under `strict` on any GPU of its class, saying so.
"""

from __future__ import annotations

import enum
import shlex
import warnings
from dataclasses import dataclass, field

import torch

from kiln.target.device import Device, detect
from kiln.util.safe_json import printable
from kiln.errors import EngineCompatibilityError
from kiln.target.hardware_compat import PORTABLE_MIN_CC, HardwareCompat

SOFTWARE = ("kiln", "torch", "triton", "cuda")  # kernels and tactic choices depend on these
CARD = ("name", "sms", "memory")                 # a GPU model, beyond its compute capability
INFORMATIONAL = ("driver",)                      # said, never blocking
# every key of a device fingerprint, with its types: a missing, unknown or mistyped key refuses the plan
FINGERPRINT = {"backend": str, "name": str, "kiln": str, "torch": str, "triton": (str, type(None))}
CUDA_FINGERPRINT = {"cc": str, "sms": int, "memory": int, "cuda": (str, type(None)), "driver": (str, type(None))}


class Policy(enum.Enum):
    STRICT = "strict"   # refuse a plan for another device model or software versions
    WARN = "warn"       # run it anyway, saying what differs
    RETUNE = "retune"   # re-run the autotuner on this device for the plan's layers

    @classmethod
    def parse(cls, value) -> "Policy":
        try:
            return value if isinstance(value, cls) else cls(str(value))
        except ValueError:
            raise EngineCompatibilityError(f"policy {value!r} is not one of strict, warn, retune") from None


class CompatibilityWarning(UserWarning):
    """A plan runs on a device or software it was not built or tuned for."""


@dataclass
class Report:
    """What differs between the plan's build machine and this one."""

    device: Device
    built: dict
    compat: HardwareCompat
    blocking: list[str] = field(default_factory=list)   # refused under strict
    notes: list[str] = field(default_factory=list)      # differences the plan's compat class allows, or harmless

    @property
    def differs(self) -> bool:
        return bool(self.blocking or self.notes)


def _diff(key: str, built, here) -> str:
    return f"{key}: built with {built!r}, running {here!r}"


def _cc(value) -> tuple[int, int] | None:
    try:
        major, minor = str(value).split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _check_fingerprint(built, source: str) -> None:
    """Every key of the fingerprint present, typed as kiln writes it, and no other."""
    if not isinstance(built, dict):
        raise EngineCompatibilityError(f"{source} has no device fingerprint in its header; rebuild it")
    keys = FINGERPRINT | (CUDA_FINGERPRINT if built.get("backend") == "cuda" else {})
    missing, unknown = [k for k in keys if k not in built], [k for k in built if k not in keys]
    mistyped = [k for k, v in built.items() if k in keys and (isinstance(v, bool) or not isinstance(v, keys[k]))]
    if missing or unknown or mistyped:
        what = "; ".join(f"{label} {printable(ks)}" for label, ks in
                         (("lacks", missing), ("has unknown keys", unknown), ("mistypes", mistyped)) if ks)
        raise EngineCompatibilityError(f"{source}: the device fingerprint in its header {what}, so kiln cannot "
                                       "tell where the plan may run (it was edited or corrupted); rebuild it")


def compare(header: dict, source: str = "plan") -> Report:
    """The differences between the header's device fingerprint and this machine (no policy applied)."""
    built = header.get("device")
    _check_fingerprint(built, source)
    backend = built.get("backend")
    if backend == "cuda" and not torch.cuda.is_available():
        raise EngineCompatibilityError(
            f"{source} was built for GPU {built.get('name')!r} but this machine has no CUDA GPU; "
            "rebuild it here with `kiln build MODEL.onnx --device cpu`")
    if backend not in ("cpu", "cuda"):
        raise EngineCompatibilityError(f"{source} names an unknown backend {backend!r}; rebuild it")
    try:
        compat = HardwareCompat.parse(header.get("hardware_compat", "none"))
    except Exception:
        raise EngineCompatibilityError(f"{source} names an unknown hardware-compat class "
                                       f"{header.get('hardware_compat')!r}; rebuild it") from None
    device = detect(backend)
    here = device.fingerprint()
    report = Report(device, built, compat)
    present = lambda keys: [k for k in keys if k in built and built[k] != here.get(k)]  # noqa: E731
    report.blocking += [_diff(k, built[k], here.get(k)) for k in present(SOFTWARE)]
    report.notes += [_diff(k, built[k], here.get(k)) for k in present(INFORMATIONAL)]
    if backend == "cpu":
        report.notes += [_diff(k, built[k], here.get(k)) for k in present(("name",))]
        return report
    card = [_diff(k, built[k], here.get(k)) for k in present(CARD)]
    cc_differs = built["cc"] != here.get("cc")
    if compat is HardwareCompat.NONE:
        report.blocking += card + ([_diff("cc", built["cc"], here.get("cc"))] if cc_differs else [])
    elif compat is HardwareCompat.SAME_CC:
        if cc_differs:
            report.blocking.append(_diff("cc", built["cc"], here.get("cc")) +
                                   " (the plan is hardware-compat same-cc: it runs on GPUs of its compute capability)")
        if card:
            report.notes.append(f"plan is hardware-compat same-cc and runs on this GPU of compute capability "
                                f"{here.get('cc')}, but was tuned on {built.get('name')!r}")
    else:
        cc = _cc(here.get("cc"))
        if cc is not None and cc < PORTABLE_MIN_CC:
            sm = f"sm{PORTABLE_MIN_CC[0]}{PORTABLE_MIN_CC[1]}"
            report.blocking.append(f"cc: this GPU has compute capability {here.get('cc')}; the plan is "
                                   f"hardware-compat portable, for {sm} and newer")
        if card or cc_differs:
            report.notes.append(f"plan is hardware-compat portable and runs on this GPU ({here.get('name')!r}, "
                                f"cc {here.get('cc')}), but was tuned on {built.get('name')!r} "
                                f"(cc {built.get('cc')!r})")
    return report


def message(report: Report, header: dict, source: str, refused: bool) -> str:
    """Each difference, then what to do: rebuild, retune, or load anyway. The plan's own text (its recorded
    build command) is quoted as data, escaped, never offered as a command to run."""
    diffs = report.blocking + report.notes
    head = (f"{source} was built for another device or software and is refused under policy strict"
            if refused else f"{source} runs on a device or software it was not built for")
    recorded = f" (the plan says it was built with: {printable(header['rebuild'])})" \
        if isinstance(header.get("rebuild"), str) else ""
    plan = shlex.quote(source)
    fixes = (f"rebuild it here from its ONNX model with `kiln build MODEL.onnx -o PLAN`{recorded}; "
             "or re-tune it for this device (fast with a timing cache): "
             f"`kiln retune {plan} -o NEW.plan --timing-cache CACHE` (in Python: kiln.load(path, policy='retune'))")
    if refused:
        fixes += "; or run it as it is with --policy warn"
    return f"{head}: {'; '.join(diffs)}. To get full speed here, {fixes}"


def check(header: dict, policy: Policy | str = Policy.STRICT, source: str = "plan") -> Report:
    """Apply `policy`: strict raises EngineCompatibilityError naming each blocking difference; otherwise every
    difference is said as a CompatibilityWarning (under retune, the caller re-tunes when `report.differs`)."""
    policy = Policy.parse(policy)
    report = compare(header, source)
    if policy is Policy.STRICT and report.blocking:
        raise EngineCompatibilityError(message(report, header, source, refused=True))
    if report.differs and policy is not Policy.RETUNE:
        warnings.warn(message(report, header, source, refused=False), CompatibilityWarning, stacklevel=4)
    return report


def rebuild_command(config: dict, source: str, plan: str) -> str:
    """The `kiln build` command line that rebuilds a plan with the same options."""
    args = ["kiln", "build", source if source and not source.startswith("<") else "MODEL.onnx", "-o", plan]
    args += [f"--{f}" for f in ("fp16", "bf16", "tf32", "int8", "fp8") if config.get(f)]
    profiles = config.get("profiles") or []
    if profiles:
        p = profiles[0]
        dims = lambda s: "x".join(map(str, s))  # noqa: E731
        fixed = [n for n, r in p.items() if r["min"] == r["max"] and all(q.get(n) == r for q in profiles)]
        if fixed:
            args += ["--shapes", ",".join(f"{n}:{dims(p[n]['min'])}" for n in fixed)]
        spec = lambda q, which: ",".join(f"{n}:{dims(r[which])}" for n, r in q.items() if n not in fixed)  # noqa: E731
        for q in profiles if len(profiles) > 1 else ():
            args += ["--profile", *(spec(q, which) for which in ("min", "opt", "max"))]
        for which in ("min", "opt", "max") if len(profiles) == 1 and len(fixed) < len(p) else ():
            args += [f"--{which}-shapes", spec(p, which)]
    if config.get("opt_level", 3) != 3:
        args += ["--opt-level", str(config["opt_level"])]
    if config.get("hardware_compat", "none") != "none":
        args += ["--hardware-compat", config["hardware_compat"]]
    for name, precision in (config.get("layer_precisions") or {}).items():
        args += ["--layer-precision", f"{name}={precision}"]
    args += ["--timing-cache", "CACHE"] if config.get("timing_cache") else []
    return shlex.join(args)
