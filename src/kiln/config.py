"""Build configuration, frozen at build start and recorded in the plan."""

from __future__ import annotations

import numbers
import operator
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kiln.errors import ConfigError
from kiln.target.hardware_compat import HardwareCompat

Shape = tuple[int, ...]
MAX_DIM = 2**63 - 1  # a dimension must fit in int64, as ONNX and torch store it


def _dims(shape) -> Shape:
    """`shape` as a tuple of ints in 0..MAX_DIM, or a ConfigError saying what is wrong."""
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ConfigError(f"shape {shape!r} is not a sequence of ints; write it like (1, 3, 224, 224)") from None
    if not all(0 <= d <= MAX_DIM for d in dims):
        raise ConfigError(f"shape {dims}: every dimension must be in 0..{MAX_DIM} (int64)")
    return dims


@dataclass(frozen=True)
class ShapeRange:
    """The min / opt / max shape an input may take in one optimization profile."""

    min: Shape
    opt: Shape
    max: Shape

    def __post_init__(self):
        for which in ("min", "opt", "max"):
            object.__setattr__(self, which, _dims(getattr(self, which)))
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ConfigError(f"profile shapes {self.min}/{self.opt}/{self.max} have different ranks")
        for lo, o, hi in zip(self.min, self.opt, self.max):
            if not (0 <= lo <= o <= hi):
                raise ConfigError(f"profile shapes must satisfy 0 <= min <= opt <= max per dim; "
                                  f"got min={self.min} opt={self.opt} max={self.max}")

    @classmethod
    def fixed(cls, shape) -> "ShapeRange":
        return cls(shape, shape, shape)

    @property
    def is_static(self) -> bool:
        return self.min == self.max

    def contains(self, shape) -> bool:
        return len(shape) == len(self.min) and all(lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max))

    def __str__(self) -> str:
        fmt = lambda s: "x".join(map(str, s))  # noqa: E731
        return fmt(self.min) if self.is_static else f"{fmt(self.min)}..{fmt(self.max)} (opt {fmt(self.opt)})"


Profile = dict[str, ShapeRange]
_PATHS = ("timing_cache", "calib", "calib_cache", "validation")
_TYPES = {"bool": ((bool,), "True or False"), "int": ((numbers.Integral,), "an int"),
          "int | None": ((numbers.Integral, type(None)), "an int or None"), "float": ((numbers.Real,), "a number"),
          "str": ((str,), "a string"), "str | None": ((str, type(None)), "a string or None"),
          "dict[str, str]": ((dict,), "a dict")}


def _profiles(profiles) -> tuple[Profile, ...]:
    """`profiles` as a tuple of {input name: ShapeRange}, each range given as a ShapeRange or (min, opt, max)."""
    fix = "give a list of dicts, one per profile, {input name: ShapeRange(min, opt, max) or (min, opt, max)}"
    if not isinstance(profiles, (tuple, list)) or not all(isinstance(p, Mapping) for p in profiles):
        raise ConfigError(f"BuildConfig profiles={profiles!r} is malformed; {fix}")
    out = []
    for p in profiles:
        ranges = {}
        for name, r in p.items():
            if not isinstance(name, str):
                raise ConfigError(f"BuildConfig profiles: input name {name!r} is not a string; {fix}")
            if not isinstance(r, ShapeRange):
                if isinstance(r, (str, bytes)) or not isinstance(r, (tuple, list)) or len(r) != 3:
                    raise ConfigError(f"BuildConfig profiles: input {name!r}: {r!r} is not (min, opt, max); {fix}")
                try:
                    r = ShapeRange(*r)
                except ConfigError as e:
                    raise ConfigError(f"BuildConfig profiles: input {name!r}: {e}") from None
            ranges[name] = r
        out.append(ranges)
    return tuple(out)


@dataclass(frozen=True)
class BuildConfig:
    """What to build: precisions, shape profiles, tuning effort, target device."""

    fp16: bool = False
    bf16: bool = False
    tf32: bool = False
    int8: bool = False
    fp8: bool = False
    profiles: tuple[Profile, ...] = ()
    timing_cache: str | None = None
    opt_level: int = 3
    device: str = "auto"
    layer_precisions: dict[str, str] = field(default_factory=dict)
    keep_io_precision: bool = True
    cuda_graph: bool = True
    workspace_bytes: int | None = None   # most transient memory one kernel may take (--memory-pool workspace=)
    fold_budget_bytes: int = 64 * 2**20
    calib: str | None = None            # --int8 / --fp8 calibration data: .npz, folder of NAME.npy, or .npy
    calibrator: str = "entropy"         # minmax | entropy | percentile | mse (kiln.quant.calibrators)
    calib_cache: str | None = None      # calibration cache JSON: read when it fits, written after calibrating
    calib_batch: int = 16               # samples per calibration batch (the scales do not depend on it)
    calib_percentile: float = 99.99
    accuracy: str | None = None         # --int8/--fp8 accuracy budget, e.g. "cosine>=0.995" (kiln.quant.budget)
    validation: str | None = None       # the budget's validation data (.npz or folder of NAME.npy)
    hardware_compat: str = "none"   # none | same-cc | portable: the devices the plan's tactics must be valid on

    def __post_init__(self):
        self._check_types()
        if not 0 <= self.opt_level <= 5:
            raise ConfigError(f"opt_level must be 0..5, got {self.opt_level}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.workspace_bytes is not None and self.workspace_bytes < 0:
            raise ConfigError(f"workspace limit must be >= 0 bytes, got {self.workspace_bytes}")
        object.__setattr__(self, "hardware_compat", HardwareCompat.parse(self.hardware_compat).value)
        if self.fp16 and self.bf16:
            raise ConfigError("choose one of fp16 and bf16")
        object.__setattr__(self, "profiles", _profiles(self.profiles))
        if self.calib_batch < 1 or not 0 < self.calib_percentile <= 100:
            raise ConfigError("calib_batch must be >= 1 and calib_percentile in (0, 100]")
        if self.accuracy is not None:
            if not (self.int8 or self.fp8):
                raise ConfigError("--accuracy chooses which layers run int8 (or fp8): add --int8 or --fp8 (and "
                                  "--calib DATA)")
        given = [flag for flag, on in (("--calib", self.calib), ("--calib-cache", self.calib_cache),
                                       ("--calibrator", self.calibrator != type(self).calibrator)) if on]
        if given and not (self.int8 or self.fp8):
            raise ConfigError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} --int8 or --fp8 "
                              "(int8=True or fp8=True): calibration only picks int8/fp8 scales")
        for name in ("calib", "calib_cache", "validation"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(Path(getattr(self, name))))
        if self.timing_cache is not None:
            object.__setattr__(self, "timing_cache", str(Path(self.timing_cache)))

    def _check_types(self) -> None:
        """Every field holds its declared type (paths may be os.PathLike, numpy ints are ints): a ConfigError
        naming the field otherwise."""
        for f in fields(self):
            value = getattr(self, f.name)
            want, what = _TYPES.get(f.type, ((object,), ""))
            if f.name in _PATHS:
                want, what = want + (os.PathLike,), "a path or None"
            if not isinstance(value, want) or isinstance(value, bool) and f.type != "bool":
                raise ConfigError(f"BuildConfig {f.name}={value!r}: expected {what}, got {type(value).__name__}")
            if isinstance(value, numbers.Number) and f.type != "bool":  # numpy scalars as Python numbers
                object.__setattr__(self, f.name, int(value) if isinstance(value, numbers.Integral) else float(value))

    @classmethod
    def with_shapes(cls, shapes: dict[str, Shape], **kw) -> "BuildConfig":
        """A config with one static profile: every named input fixed to the given shape."""
        if not isinstance(shapes, Mapping):
            raise ConfigError(f"with_shapes: shapes must be a dict of input name → shape, got {type(shapes).__name__}")
        return cls(profiles=({k: (v, v, v) for k, v in shapes.items()},), **kw)

    def to_json(self) -> dict:
        d = asdict(self)
        d["profiles"] = [{k: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)} for k, r in p.items()}
                         for p in self.profiles]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "BuildConfig":
        d = dict(d)
        d["profiles"] = tuple({k: ShapeRange(tuple(r["min"]), tuple(r["opt"]), tuple(r["max"])) for k, r in p.items()}
                              for p in d.get("profiles", []))
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})
