"""The per-tensor statistics calibration collects in one pass: exact min/max and a histogram of |x|.

The histogram has BINS bins over [0, R), R = 2^e the smallest power of two above every |x| seen so far.
When a larger value arrives, R doubles (or more) and adjacent bins are summed: with a power-of-two
bin width this merge is exact, so the final histogram depends only on the multiset of values seen,
never on how they were split into batches or in which order they came.
"""

from __future__ import annotations

import math

import torch

BINS = 2048


class Histogram:
    """Statistics of one tensor over all calibration batches (module docstring)."""

    def __init__(self, bins: int = BINS):
        self.bins = bins
        self.counts: torch.Tensor | None = None   # int64 [bins], on the device the data lives on
        self.exp: int | None = None                # R = 2 ** exp
        self.zeros = 0                             # values counted before any non-zero one fixed R
        self.lo, self.hi = math.inf, -math.inf
        self.nonfinite = 0

    @property
    def width(self) -> float:
        return 0.0 if self.exp is None else 2.0 ** self.exp / self.bins

    @property
    def amax(self) -> float:
        return max(abs(self.lo), abs(self.hi)) if self.lo <= self.hi else 0.0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1).float()
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            self.nonfinite += int((~finite).sum())
            x = x[finite]
        if x.numel() == 0:
            return
        lo, hi = torch.aminmax(x)
        self.lo, self.hi = min(self.lo, float(lo)), max(self.hi, float(hi))
        a = x.abs()
        m = float(a.max())
        if m == 0.0:
            if self.counts is None:
                self.zeros += a.numel()
            else:
                self.counts[0] += a.numel()
            return
        self._grow(math.frexp(m)[1], a.device)  # 2**e > m
        idx = (a * (self.bins / 2.0 ** self.exp)).floor().long()  # a power-of-two factor: exact
        self.counts += torch.bincount(idx, minlength=self.bins)

    def _grow(self, exp: int, device) -> None:
        if self.counts is None:
            self.counts = torch.zeros(self.bins, dtype=torch.int64, device=device)
            self.counts[0] += self.zeros
            self.exp = exp
            return
        if exp <= self.exp:
            return
        factor = 2 ** (exp - self.exp)
        merged = torch.zeros(self.bins, dtype=torch.int64, device=self.counts.device)
        if factor >= self.bins:
            merged[0] = self.counts.sum()
        else:
            merged[: self.bins // factor] = self.counts.reshape(-1, factor).sum(1)
        self.counts, self.exp = merged, exp

    def numpy(self):
        """(counts as float64, bin width); counts all zero (width 0) when every value was 0."""
        import numpy as np

        if self.counts is None:
            c = np.zeros(self.bins)
            c[0] = self.zeros
            return c, 0.0
        return self.counts.cpu().numpy().astype(np.float64), self.width
