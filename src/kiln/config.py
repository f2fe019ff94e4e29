"""Build configuration, frozen at build start and recorded in the plan."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kiln.errors import ConfigError
from kiln.tactics.hardware_compat import HardwareCompat

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ShapeRange:
    """The min / opt / max shape an input may take in one optimization profile."""

    min: Shape
    opt: Shape
    max: Shape

    def __post_init__(self):
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ConfigError(f"profile shapes {self.min}/{self.opt}/{self.max} have different ranks")
        for lo, o, hi in zip(self.min, self.opt, self.max):
            if not (0 <= lo <= o <= hi):
                raise ConfigError(f"profile shapes must satisfy 0 <= min <= opt <= max per dim; "
                                  f"got min={self.min} opt={self.opt} max={self.max}")

    @classmethod
    def fixed(cls, shape) -> "ShapeRange":
        s = tuple(int(d) for d in shape)
        return cls(s, s, s)

    @property
    def is_static(self) -> bool:
        return self.min == self.max

    def contains(self, shape) -> bool:
        return len(shape) == len(self.min) and all(lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max))

    def __str__(self) -> str:
        fmt = lambda s: "x".join(map(str, s))  # noqa: E731
        return fmt(self.min) if self.is_static else f"{fmt(self.min)}..{fmt(self.max)} (opt {fmt(self.opt)})"


Profile = dict[str, ShapeRange]


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
        if not 0 <= self.opt_level <= 5:
            raise ConfigError(f"opt_level must be 0..5, got {self.opt_level}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.workspace_bytes is not None and self.workspace_bytes < 0:
            raise ConfigError(f"workspace limit must be >= 0 bytes, got {self.workspace_bytes}")
        object.__setattr__(self, "hardware_compat", HardwareCompat.parse(self.hardware_compat).value)
        if self.fp16 and self.bf16:
            raise ConfigError("choose one of fp16 and bf16")
        profiles = tuple({k: (v if isinstance(v, ShapeRange) else ShapeRange(*v)) for k, v in p.items()}
                         for p in self.profiles)
        object.__setattr__(self, "profiles", profiles)
        from kiln.quant.calibrators import CALIBRATORS
        if self.calibrator not in CALIBRATORS:
            raise ConfigError(f"unknown calibrator {self.calibrator!r}; choose one of {', '.join(CALIBRATORS)}")
        if self.calib_batch < 1 or not 0 < self.calib_percentile <= 100:
            raise ConfigError("calib_batch must be >= 1 and calib_percentile in (0, 100]")
        if self.accuracy is not None:
            from kiln.quant.budget import AccuracyBudget
            AccuracyBudget.parse(self.accuracy)
            if not (self.int8 or self.fp8):
                raise ConfigError("--accuracy chooses which layers run int8 (or fp8): add --int8 or --fp8 (and "
                                  "--calib DATA)")
        for name in ("calib", "calib_cache", "validation"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(Path(getattr(self, name))))
        if self.timing_cache is not None:
            object.__setattr__(self, "timing_cache", str(Path(self.timing_cache)))

    @classmethod
    def with_shapes(cls, shapes: dict[str, Shape], **kw) -> "BuildConfig":
        """A config with one static profile: every named input fixed to the given shape."""
        return cls(profiles=({k: ShapeRange.fixed(v) for k, v in shapes.items()},), **kw)

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
