"""Summary statistics of a series of times: min, max, mean, median and chosen percentiles; run-to-run spread."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kiln.errors import ConfigError

DEFAULT_PERCENTILES = (90.0, 99.0)


def parse_percentiles(spec: str | None) -> tuple[float, ...]:
    """`"90,99,99.9"` → (90.0, 99.0, 99.9); each must lie in [0, 100]."""
    if spec is None:
        return DEFAULT_PERCENTILES
    try:
        values = tuple(float(x) for x in spec.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or not all(0 <= v <= 100 for v in values):
        raise ConfigError(f"--percentiles {spec!r} is not a comma-separated list of numbers in 0..100; "
                          "write e.g. --percentiles 90,95,99")
    return values


def percentile_key(q: float) -> str:
    """90.0 → "p90", 99.9 → "p99.9"."""
    return f"p{q:g}"


def summarize(values: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """min / mean / median / each percentile / max of `values` (numpy's linear interpolation between ranks)."""
    a = np.asarray(values, dtype=np.float64)
    out = {"min": float(a.min()), "mean": float(a.mean()), "median": float(np.median(a))}
    out.update({percentile_key(q): float(np.percentile(a, q)) for q in percentiles})
    out["max"] = float(a.max())
    return out


def spread(values: Sequence[float]) -> float | None:
    """How much the median moves over the run: the timed series cut into quarters (halves when short), the
    range of their medians over the overall median. None when there are too few values to tell."""
    n = len(values)
    parts = 4 if n >= 16 else 2 if n >= 4 else 0
    if not parts:
        return None
    overall = float(np.median(values))
    if overall <= 0:
        return None
    medians = [float(np.median(chunk)) for chunk in np.array_split(np.asarray(values, dtype=np.float64), parts)]
    return (max(medians) - min(medians)) / overall
