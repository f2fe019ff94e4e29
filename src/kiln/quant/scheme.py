"""kiln's int8 scheme (kinds/quantized.py has the exact arithmetic) and the scales a build quantizes with.

Weights: symmetric int8 per output channel, scale[c] = max|w[c]| / 127, w_q = round_half_even(w / scale).
Activations: symmetric int8 per tensor, scale = amax / 127 where amax comes from calibration or from
the model's own Q/DQ nodes. Scales are fp32 values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kiln.kinds.quantized import QMAX

TINY = 2.0 ** -30  # the smallest amax used: an all-zero tensor still gets a finite, positive scale


def fp32(value: float) -> float:
    """`value` rounded to the nearest fp32, as a Python float."""
    return float(torch.tensor(value, dtype=torch.float32))


def scale_from_amax(amax: float) -> float:
    """The per-tensor activation scale mapping [-amax, amax] onto [-127, 127]."""
    return fp32(max(float(amax), TINY) / QMAX)


def quantize_weight(w: torch.Tensor, axis: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q int8, scale fp32 [w.shape[axis]]): symmetric per-channel quantization along `axis`."""
    w = w.float()
    moved = w.movedim(axis, 0).reshape(w.shape[axis], -1)
    amax = moved.abs().amax(dim=1) if moved.shape[1] else torch.zeros(w.shape[axis])
    scale = amax.clamp(min=TINY) / QMAX
    shape = [1] * w.dim()
    shape[axis] = -1
    q = torch.round(w / scale.reshape(shape)).clamp(-QMAX, QMAX).to(torch.int8)
    return q, scale


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
