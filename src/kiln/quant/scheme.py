"""kiln's int8 / fp8 scheme (kinds/quantized.py has the exact arithmetic) and the scales a build quantizes with.

Weights: symmetric per output channel, scale[c] = max|w[c]| / qmax, w_q = qtype(w / scale) (int8: qmax 127,
round half to even; fp8 e4m3: qmax 448, nearest e4m3 value, ties to even). Activations: symmetric per tensor,
scale = amax / qmax where amax comes from calibration or from the model's own Q/DQ nodes. Calibration and its
cache keep int8 scales (amax / 127); an fp8 build takes amax = 127 · scale from them (`for_qtype`), so one
calibration serves both. Scales are fp32 values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kiln.kinds.qtype import INT8, QType

TINY = 2.0 ** -30  # the smallest amax used: an all-zero tensor still gets a finite, positive scale


def fp32(value: float) -> float:
    """`value` rounded to the nearest fp32, as a Python float."""
    return float(torch.tensor(value, dtype=torch.float32))


def scale_from_amax(amax: float, qtype: QType = INT8) -> float:
    """The per-tensor activation scale mapping [-amax, amax] onto [-qmax, qmax]."""
    return fp32(max(float(amax), TINY) / qtype.qmax)


def quantize_weight(w: torch.Tensor, axis: int = 0, qtype: QType = INT8) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q of `qtype`, scale fp32 [w.shape[axis]]): symmetric per-channel quantization along `axis`."""
    w = w.float()
    moved = w.movedim(axis, 0).reshape(w.shape[axis], -1)
    amax = moved.abs().amax(dim=1) if moved.shape[1] else torch.zeros(w.shape[axis])
    scale = amax.clamp(min=TINY) / qtype.qmax
    shape = [1] * w.dim()
    shape[axis] = -1
    return qtype.quantize(w / scale.reshape(shape)), scale


@dataclass(frozen=True)
class TensorScale:
    """One activation tensor's quantization: fp32 scale, where it came from, and the range seen."""

    scale: float
    source: str                       # "calibrated (entropy)", "Q/DQ", "cache (entropy)", ...
    range: tuple[float, float] | None = None  # observed (min, max), when calibrated


@dataclass(frozen=True)
class WeightQuant:
    """A weight the model itself quantized (DequantizeLinear of an int8 constant)."""

    q: torch.Tensor          # int8, as stored in the model
    scale: torch.Tensor      # fp32, scalar or 1-D along `axis`
    axis: int


@dataclass
class QuantScales:
    """The scales a build quantizes with, by tensor name; `qdq`: they are the model's own."""

    activations: dict[str, TensorScale] = field(default_factory=dict)
    weights: dict[str, WeightQuant] = field(default_factory=dict)
    qdq: bool = False
    notes: list[str] = field(default_factory=list)


def for_qtype(scales: QuantScales, qtype: QType) -> QuantScales:
    """`scales` (int8: amax / 127) as the scales of `qtype`: amax = 127 · scale, then amax / qtype.qmax."""
    if qtype is INT8:
        return scales
    acts = {n: TensorScale(scale_from_amax(s.scale * INT8.qmax, qtype), s.source, s.range)
            for n, s in scales.activations.items()}
    return QuantScales(acts, dict(scales.weights), scales.qdq, list(scales.notes))
