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


MAX_SHAPE_BUCKETS = 16
_BUCKETS_HELP = ("shape buckets (shape_buckets=N, --shape-buckets N) split a dynamic optimization profile; give one: "
                 "--profile MIN OPT MAX or --min-shapes/--max-shapes (BuildConfig(profiles=[{input: (min, opt, "
                 "max)}]))")


def bucket_bounds(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi] cut into at most `n` contiguous, non-overlapping ranges (lo_k, hi_k) in ascending order, with geometric
    edges: bucket k starts near lo * (hi / lo) ** (k / n) (lo taken as 1 when 0), e.g. 1..64, n=3 → 1..3, 4..15,
    16..64. Edges that round to the same integer are merged, so a range narrower than `n` gives fewer buckets
    (1..2, n=4 → 1..1, 2..2); a fixed range (lo == hi) or n <= 1 gives [(lo, hi)]."""
    if n <= 1 or hi <= lo:
        return [(lo, hi)]
    base = max(lo, 1)
    starts = sorted({min(hi, max(lo + 1, round(base * (hi / base) ** (k / n)))) for k in range(1, n)})
    return list(zip([lo, *starts], [s - 1 for s in starts] + [hi]))


def _split_axis(p: Profile) -> tuple[int, tuple[str, ...]] | None:
    """The dimension a profile's shape buckets cut and the inputs cut along it: dim 0 of every input whose dim 0
    varies over the same range as the first such input's (the batch), else the first varying dim of the first
    input that varies; None for a static profile."""
    batch = [n for n, r in p.items() if r.min and r.min[0] < r.max[0]]
    if batch:
        span = (p[batch[0]].min[0], p[batch[0]].max[0])
        return 0, tuple(n for n in batch if (p[n].min[0], p[n].max[0]) == span)
    for n, r in p.items():
        for d, (lo, hi) in enumerate(zip(r.min, r.max)):
            if lo < hi:
                return d, (n,)
    return None


def split_profile(p: Profile, n: int) -> list[Profile]:
    """Profile `p` as up to `n` shape buckets (see `bucket_bounds`) along its split axis (`_split_axis`): the cut
    inputs take each bucket's range there, with opt = the user's opt where it falls inside the bucket, else the
    bucket's max (where a throughput kernel for the bucket is tuned); every other dim and input keeps `p`'s ranges.
    The bucket holding the user's opt comes first (so profile 0 still tunes at the opt shape given), then the others
    in ascending order. A static profile is returned as it is."""
    axis = _split_axis(p)
    if axis is None:
        return [p]
    dim, names = axis
    lead = p[names[0]]

    def at(shape: Shape, value: int) -> Shape:
        return shape[:dim] + (value,) + shape[dim + 1:]

    out = []
    for lo, hi in bucket_bounds(lead.min[dim], lead.max[dim], n):
        bucket = dict(p)
        for name in names:
            r = p[name]
            opt = r.opt[dim] if lo <= r.opt[dim] <= hi else hi
            bucket[name] = ShapeRange(at(r.min, lo), at(r.opt, opt), at(r.max, hi))
        out.append(bucket)
    out.sort(key=lambda b: b[names[0]].opt[dim] != lead.opt[dim])  # stable: the opt's bucket first
    return out


def split_profiles(profiles: tuple[Profile, ...], n: int) -> tuple[tuple[Profile, ...], tuple]:
    """Each profile split into up to `n` shape buckets (`split_profile`), in place of it: (the profiles, per profile
    (the index of the profile it was split from, the dim cut or -1 for a static one left whole, the inputs cut)).
    A ConfigError when no profile is dynamic."""
    if not any(_split_axis(p) for p in profiles):
        raise ConfigError(f"shape_buckets={n}: no optimization profile has a varying dimension to split; "
                          f"{_BUCKETS_HELP}")
    out, record = [], []
    for k, p in enumerate(profiles):
        axis = _split_axis(p)
        buckets = split_profile(p, n)
        out += buckets
        record += [(k, axis[0], axis[1]) if axis else (k, -1, ())] * len(buckets)
    return tuple(out), tuple(record)


def _profile_buckets(record, profiles: tuple[Profile, ...]) -> tuple:
    """A stored split record (a plan's config, `dataclasses.replace`) as tuples, or a ConfigError if it does not fit
    the profiles."""
    try:
        out = tuple((int(k), int(d), tuple(str(n) for n in names)) for k, d, names in record)
    except (TypeError, ValueError):
        out = None
    if out is None or len(out) != len(profiles):
        raise ConfigError("BuildConfig profile_buckets is written by the shape-bucket split (one entry per profile); "
                          "leave it out and give shape_buckets=N")
    return out


def bucket_notes(config: "BuildConfig") -> list[str]:
    """What the shape-bucket split did, one build note per profile the user gave."""
    if config.shape_buckets <= 1 or not config.profile_buckets:
        return []
    groups: dict[int, list[int]] = {}
    for i, (k, _, _) in enumerate(config.profile_buckets):
        groups.setdefault(k, []).append(i)
    notes = []
    for k, members in groups.items():
        _, dim, names = config.profile_buckets[members[0]]
        if dim < 0:
            notes.append(f"shape buckets: profile {k} is static, not split (it is profile {members[0]})")
            continue
        along = f"the batch (dim 0 of {', '.join(names)})" if dim == 0 else \
            f"dim {dim} of {names[0]} (no input's dim 0 varies)"
        ranges = ", ".join(f"{i}: {r.min[dim]}..{r.max[dim]} (opt {r.opt[dim]})"
                           for i, r in ((i, config.profiles[i][names[0]]) for i in members))
        notes.append(f"shape buckets: profile {k} split along {along} into {len(members)} profiles, each tuned at "
                     f"its opt: {ranges}")
    return notes


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
    smooth_alpha: float = 0.0           # --int8/--fp8 SmoothQuant strength α in (0, 1]; 0: off (quant/smooth.py)
    accuracy: str | None = None         # --int8/--fp8 accuracy budget, e.g. "cosine>=0.995" (kiln.quant.budget)
    validation: str | None = None       # the budget's validation data (.npz or folder of NAME.npy)
    hardware_compat: str = "none"   # none | same-cc | portable: the devices the plan's tactics must be valid on
    shape_buckets: int = 1          # split each dynamic profile into up to N batch buckets (split_profiles); 1: off
    profile_buckets: tuple = ()     # written by the split: per profile (profile given, dim cut, inputs cut)

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
        if not 1 <= self.shape_buckets <= MAX_SHAPE_BUCKETS:
            raise ConfigError(f"shape_buckets (--shape-buckets) must be 1..{MAX_SHAPE_BUCKETS}, got "
                              f"{self.shape_buckets}")
        if self.profile_buckets:  # already split (a plan's config, dataclasses.replace): not split again
            object.__setattr__(self, "profile_buckets", _profile_buckets(self.profile_buckets, self.profiles))
        elif self.shape_buckets > 1:
            if not self.profiles:
                raise ConfigError(f"shape_buckets={self.shape_buckets} but there is no optimization profile; "
                                  f"{_BUCKETS_HELP}")
            split, record = split_profiles(self.profiles, self.shape_buckets)
            object.__setattr__(self, "profiles", split)
            object.__setattr__(self, "profile_buckets", record)
        if self.calib_batch < 1 or not 0 < self.calib_percentile <= 100:
            raise ConfigError("calib_batch must be >= 1 and calib_percentile in (0, 100]")
        if not 0.0 <= self.smooth_alpha <= 1.0:
            raise ConfigError(f"smooth_alpha must be in [0, 1] (0: no SmoothQuant; 0.5 is usual), "
                              f"got {self.smooth_alpha}")
        if self.smooth_alpha and self.calib_cache:
            raise ConfigError("smooth_alpha does not read or write a calibration cache (it does not hold the smoothing "
                              "factors): give calibration data and drop calib_cache, or set smooth_alpha=0")
        if self.accuracy is not None:
            if not (self.int8 or self.fp8):
                raise ConfigError("--accuracy chooses which layers run int8 (or fp8): add --int8 or --fp8 (and "
                                  "--calib DATA)")
        given = [flag for flag, on in (("--calib", self.calib), ("--calib-cache", self.calib_cache),
                                       ("--calibrator", self.calibrator != type(self).calibrator),
                                       ("smooth_alpha", self.smooth_alpha != 0.0)) if on]
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
