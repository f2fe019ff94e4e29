"""Error metrics between a reference array and kiln's, and the tolerances they pass or fail against."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kiln.errors import ConfigError

# Defaults per compute precision, from each type's unit roundoff: fp32 ≈ 6e-8 (1e-4 leaves room for
# reassociation over long reductions), tf32/fp16 ≈ 5e-4, bf16 ≈ 4e-3.
DEFAULT_TOLERANCES = {"fp32": (1e-4, 1e-5), "tf32": (1e-3, 1e-4), "fp16": (1e-2, 1e-3), "bf16": (5e-2, 1e-2)}


@dataclass(frozen=True)
class Tolerance:
    """Passing means |got - ref| <= atol + rtol * |ref| everywhere (or cosine similarity >= `cosine` when set),
    with NaN and Inf exactly where the reference has them."""

    rtol: float
    atol: float
    cosine: float | None = None

    def __str__(self) -> str:
        return f"cosine>={self.cosine}" if self.cosine is not None else f"rtol={self.rtol:g}, atol={self.atol:g}"


@dataclass(frozen=True)
class Metrics:
    """How far one tensor of kiln's is from the reference; `ratio` > 1 means it fails its tolerance."""

    shape: tuple[int, ...]
    max_abs: float
    mean_abs: float
    median_abs: float
    max_rel: float
    mean_rel: float
    median_rel: float
    cosine: float
    nan_ref: int
    inf_ref: int
    nan_got: int
    inf_got: int
    ratio: float
    passed: bool
    note: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def parse_tolerance(spec: str) -> tuple[str, Tolerance]:
    """`--tol out=rtol,atol` → ("out", Tolerance(rtol, atol))."""
    name, sep, values = spec.rpartition("=")
    parts = values.split(",")
    try:
        rtol, atol = (float(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        rtol = atol = None
    if not sep or not name or rtol is None or not (rtol >= 0 and atol >= 0):
        raise ConfigError(f"--tol {spec!r} is not OUTPUT=RTOL,ATOL with two non-negative numbers; "
                          "e.g. --tol logits=1e-3,1e-4")
    return name, Tolerance(rtol, atol)


def compare_arrays(ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> Metrics:
    """Metrics of `got` against `ref` (compared in float64; text and other non-numbers must be equal)."""
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        return _failed(got.shape, f"shape {list(got.shape)} differs from the reference's {list(ref.shape)}")
    if ref.dtype.kind in "OUS" or got.dtype.kind in "OUS":
        same = bool(np.all(ref == got))
        return _failed(got.shape, "" if same else "text values differ", passed=same)
    r, g = _as_float(ref), _as_float(got)
    finite = np.isfinite(r) & np.isfinite(g)
    rf, gf = r[finite], g[finite]
    abs_err = np.abs(gf - rf)
    rel_err = abs_err[rf != 0] / np.abs(rf[rf != 0])
    bound = tol.atol + tol.rtol * np.abs(rf)
    special = ~np.isfinite(r)
    same_special = np.array_equal(r[special], g[special], equal_nan=True) and bool(np.isfinite(g[~special]).all())
    cos = _cosine(rf, gf)
    ratio = _cosine_ratio(cos, tol.cosine) if tol.cosine is not None else _allclose_ratio(abs_err, bound)
    if not same_special:
        ratio = math.inf
    return Metrics(tuple(got.shape), *_summary(abs_err), *_summary(rel_err), cos,
                   int(np.isnan(r).sum()), int(np.isinf(r).sum()), int(np.isnan(g).sum()), int(np.isinf(g).sum()),
                   ratio, ratio <= 1.0, "" if same_special else "NaN/Inf where the reference has none (or vice versa)")


def _summary(a: np.ndarray) -> tuple[float, float, float]:
    """(max, mean, median), zeros for no elements."""
    return (float(a.max()), float(a.mean()), float(np.median(a))) if a.size else (0.0, 0.0, 0.0)


def _allclose_ratio(abs_err: np.ndarray, bound: np.ndarray) -> float:
    """The largest error as a multiple of its allowed bound (a zero bound: any error is infinitely over)."""
    safe = np.where(bound > 0, bound, 1.0)
    excess = np.where(bound > 0, abs_err / safe, np.where(abs_err > 0, math.inf, 0.0))
    return float(excess.max(initial=0.0))


def _cosine_ratio(cos: float, wanted: float) -> float:
    """How far below 1 the cosine similarity is, as a multiple of the allowed distance 1 - `wanted`."""
    if wanted >= 1:
        return 0.0 if cos >= 1 else math.inf
    return max(0.0, (1 - cos) / (1 - wanted))


def _as_float(a: np.ndarray) -> np.ndarray:
    """float64 (complex: its real and imaginary parts side by side); bf16/fp8 (ml_dtypes) cast too."""
    if a.dtype.kind == "c":
        return np.stack([a.real, a.imag], -1).astype(np.float64)
    return a.astype(np.float64)


def _cosine(r: np.ndarray, g: np.ndarray) -> float:
    """Cosine similarity; 1.0 when both are all zeros (identical), 0.0 when only one is."""
    nr, ng = np.linalg.norm(r), np.linalg.norm(g)
    if nr == 0 or ng == 0:
        return 1.0 if nr == ng else 0.0
    return float(np.clip(np.dot(r.ravel(), g.ravel()) / (nr * ng), -1.0, 1.0))


def _failed(shape, note: str, passed: bool = False) -> Metrics:
    """Metrics for a pair that has no numeric error: only the verdict and why."""
    nan = math.nan
    return Metrics(tuple(shape), nan, nan, nan, nan, nan, nan, nan, 0, 0, 0, 0, 0.0 if passed else math.inf,
                   passed, note)
