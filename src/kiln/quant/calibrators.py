"""Calibrators: from one tensor's statistics (histogram.py) to the amax its int8 scale maps onto 127.

- minmax:     the largest |x| seen (exact, not from the histogram).
- percentile: the upper edge of the bin where the cumulative count of |x| reaches `percentile` % (99.99).
- entropy:    TensorRT's: the histogram edge i·w (i ≥ 128; at most 256 evenly spaced candidates) minimizing
              KL(P‖Q), P the histogram clipped at i (the tail added to its last bin), Q that histogram
              merged into 128 levels and spread back evenly over each level's non-empty bins.
- mse:        the edge i·w minimizing Σ count · (dequant(quant(c)) − c)², c each bin's centre.
Every calibrator reads only the histogram (or exact range), so all are independent of batch size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kiln.errors import ConfigError
from kiln.kinds.quantized import QMAX
from kiln.quant.histogram import Histogram

DEFAULT = "entropy"
DEFAULT_PERCENTILE = 99.99
MAX_CANDIDATES = 256  # entropy thresholds tried per tensor (evenly spaced edges when more bins are used)


@dataclass(frozen=True)
class Calibrator:
    name: str
    amax: Callable[[Histogram, float], float]   # (statistics, percentile) → amax
    what: str


def _minmax(h: Histogram, percentile: float) -> float:
    return h.amax


def _percentile(h: Histogram, percentile: float) -> float:
    counts, width = h.numpy()
    total = counts.sum()
    if width == 0.0 or total == 0:
        return 0.0
    cdf = np.cumsum(counts)
    i = int(np.searchsorted(cdf, total * percentile / 100.0, side="left"))
    return min((i + 1) * width, h.amax)


def _entropy(h: Histogram, percentile: float, levels: int = 128) -> float:
    counts, width = h.numpy()
    used = int(np.nonzero(counts)[0][-1]) + 1 if counts.any() and width else 0
    if used <= levels:
        return h.amax
    best, best_i = np.inf, used
    step = max(1, (used - levels) // MAX_CANDIDATES)
    for i in list(range(levels, used + 1, step)) + ([used] if (used - levels) % step else []):
        p = counts[:i].copy()
        p[i - 1] += counts[i:].sum()
        nonzero = counts[:i] != 0
        if not nonzero.any():  # every value lies past this edge: Q is empty, KL(P‖Q) infinite
            continue
        per = i // levels
        bounds = np.arange(levels) * per        # levels chunks of `per` bins, the last takes the remainder
        merged = np.add.reduceat(counts[:i], bounds)
        spread = np.add.reduceat(nonzero.astype(np.float64), bounds)
        chunk = np.minimum(np.arange(i) // per, levels - 1)
        q = np.where(nonzero, merged[chunk] / np.maximum(spread[chunk], 1), 0.0)
        p /= p.sum()
        q /= q.sum()
        m = p > 0
        kl = float(np.sum(p[m] * np.log(p[m] / np.where(q[m] > 0, q[m], 1e-30))))
        if kl < best:
            best, best_i = kl, i
    return min(best_i * width, h.amax)


def _mse(h: Histogram, percentile: float) -> float:
    counts, width = h.numpy()
    used = int(np.nonzero(counts)[0][-1]) + 1 if counts.any() and width else 0
    if used == 0:
        return h.amax
    centres = (np.arange(used) + 0.5) * width
    c, n = centres[None, :], counts[None, :used]
    amaxes = np.arange(1, used + 1) * width
    errors = np.empty(used)
    for start in range(0, used, 256):   # 256 candidates at a time bounds the temporary
        s = (amaxes[start:start + 256] / QMAX)[:, None]
        deq = np.minimum(np.round(c / s), QMAX) * s
        errors[start:start + 256] = (n * (deq - c) ** 2).sum(1)
    return min(float(amaxes[int(np.argmin(errors))]), h.amax)


CALIBRATORS = {c.name: c for c in (
    Calibrator("minmax", _minmax, "the largest |x| seen"),
    Calibrator("entropy", _entropy, "minimum KL divergence, as TensorRT's entropy calibrator"),
    Calibrator("percentile", _percentile, "a percentile of |x| (--calib-percentile, 99.99)"),
    Calibrator("mse", _mse, "minimum mean squared quantization error"),
)}


def get(name: str) -> Calibrator:
    if name not in CALIBRATORS:
        raise ConfigError(f"unknown calibrator {name!r}; choose one of {', '.join(CALIBRATORS)}")
    return CALIBRATORS[name]
