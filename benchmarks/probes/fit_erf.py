"""The rational fit behind kernels/common.erf: erf(x) ≈ x·P(x²)/Q(x²) on |x| ≤ 3.92, P and Q of degree 5, fitted
by iterated weighted least squares (Sanathanan-Koerner, then Lawson's reweighting toward the minimax error); beyond
±3.92 the kernel returns exactly ±1, as libdevice does. Prints the fp32 constants and the fp32 error (fused
multiply-adds emulated). Degrees 6 and 7 come no closer: fp32 rounding, not the fit, sets the error. CPU only.

    python -m benchmarks.probes.fit_erf
"""

from __future__ import annotations

from math import erf, sqrt

import numpy as np

CLAMP = 3.92
DEGREE = 5


def fit(samples: int = 40000) -> tuple[np.ndarray, np.ndarray]:
    """P, Q coefficients (lowest first, Q[0] = 1) in t = (x / CLAMP)², the well-conditioned variable."""
    xs = CLAMP * np.sin(np.linspace(0, np.pi / 2, samples))[1:]  # dense near 0 and near the clamp
    ys, t = np.array([erf(x) for x in xs]), (xs / CLAMP) ** 2
    basis = np.concatenate([np.stack([xs * t ** i for i in range(DEGREE + 1)], 1),
                            np.stack([-ys * t ** j for j in range(1, DEGREE + 1)], 1)], 1)
    q_prev, weight = np.ones_like(xs), np.ones_like(xs)
    for it in range(60):
        w = weight / q_prev
        coef, *_ = np.linalg.lstsq(basis * w[:, None], ys * w, rcond=None)
        p, q = coef[:DEGREE + 1], np.concatenate([[1.0], coef[DEGREE + 1:]])
        q_prev = np.polyval(q[::-1], t)
        if it > 20:
            err = np.abs(xs * np.polyval(p[::-1], t) / q_prev - ys)
            weight = np.maximum(weight * err / (weight * err).sum(), 1e-12)
    return p, q


def evaluate(p32: list, q32: list, x: np.ndarray) -> np.ndarray:
    """The kernel's arithmetic in fp32: clamp, Horner by fused multiply-adds in u = x², divide; ±1 at the clamp."""
    def fma(a, b, c):
        return (a.astype(np.float64) * b + c).astype(np.float32)

    outside = np.abs(x) >= np.float32(CLAMP)
    x = np.clip(x.astype(np.float32), np.float32(-CLAMP), np.float32(CLAMP))
    u = (x * x).astype(np.float32)
    p, q = np.full_like(u, p32[-1]), np.full_like(u, q32[-1])
    for c in p32[-2::-1]:
        p = fma(p, u, c)
    for c in q32[-2::-1]:
        q = fma(q, u, c)
    return np.where(outside, np.sign(x), (x * p).astype(np.float32) / q)


def main() -> None:
    p, q = fit()
    pu = [c / CLAMP ** (2 * i) for i, c in enumerate(p)]  # in u = x²
    p32, qu = [np.float32(c) for c in pu], [np.float32(c / CLAMP ** (2 * i)) for i, c in enumerate(q)]
    xs = np.linspace(-8, 8, 800001)
    got = evaluate(p32, qu, xs).astype(np.float64)
    want = np.array([erf(x) for x in xs])
    gelu = 0.5 * xs * (1 + evaluate(p32, qu, xs / sqrt(2)))
    gelu_want = 0.5 * xs * (1 + np.array([erf(x / sqrt(2)) for x in xs]))
    print(f"ERF_P = {[float(c) for c in p32]}")
    print(f"ERF_Q = {[float(c) for c in qu]}")
    print(f"erf max |error| {np.abs(got - want).max():.3g}; GELU max |error| {np.abs(gelu - gelu_want).max():.3g}")


if __name__ == "__main__":
    main()
