"""SmoothQuant (Xiao et al. 2023, as TensorRT-ModelOpt applies it): move each GEMM input channel's range into the
weight's matching row, so that a few outlier channels no longer set the per-tensor int8 / fp8 activation scale.

    x ─▶ FusedGemm(x, W)      (--int8 with smooth_alpha α ⇒)
    x ─▶ Mul(x, 1/s) ─▶ x' ─▶ FusedGemm(x', diag(s)·W)      s[k] = amax_k(x)^α / amax(W[k, :])^(1-α)

Exact in float (x'·W' = x·W); the quantized layer then quantizes x' per tensor and W' per output channel, as any
other (scheme.py). amax_k(x) is channel k's largest |x| over the calibration data. The Mul is an ordinary float
layer (CPU reference, GPU pointwise kernel), so every backend computes the same quantized math. Applies to
MatMul / Gemm / FusedGemm candidates whose input's last axis is the reduction; all readers of one x share s.
"""

from __future__ import annotations

import torch

from kiln.ir import DType, Layer, Network
from kiln.quant.int8 import Candidate, candidates

MIN_FACTOR = 2.0 ** -14  # s and 1/s stay within fp16's normal range (GPU int8 builds run float layers in fp16)


class ChannelAmax:
    """The largest |x| of each channel (last axis) over every batch seen (calibration's `add` interface)."""

    def __init__(self):
        self.amax: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        a = torch.nan_to_num(x.detach().float(), nan=0.0, posinf=0.0, neginf=0.0).abs()
        a = a.reshape(-1, a.shape[-1]).amax(0).cpu() if a.numel() else torch.zeros(a.shape[-1])
        self.amax = a if self.amax is None else torch.maximum(self.amax, a)


def smoothable(net: Network, keep_float: set[str] = frozenset()) -> dict[str, list[Candidate]]:
    """Input tensor → the GEMM candidates (not kept float) reading it along its last axis."""
    out: dict[str, list[Candidate]] = {}
    for name, c in candidates(net).items():
        if c.conv or name in keep_float or c.layer.inputs.count(c.x) != 1:
            continue
        out.setdefault(c.x, []).append(c)
    return {x: cs for x, cs in out.items() if x not in net.outputs}


def _rows_amax(net: Network, c: Candidate) -> torch.Tensor:
    """max |W| over the output channels, per input channel k."""
    w = net.constants[c.weight].float()
    return w.abs().amax(dim=c.out_axis)


def factors(net: Network, x: str, readers: list[Candidate], act_amax: torch.Tensor, alpha: float) -> torch.Tensor:
    """s for input `x` (module docstring), fp32 [K]."""
    w = torch.stack([_rows_amax(net, c) for c in readers]).amax(0)
    s = act_amax.double().clamp(min=1e-12) ** alpha / w.double().clamp(min=1e-12) ** (1.0 - alpha)
    return s.clamp(MIN_FACTOR, 1.0 / MIN_FACTOR).float()


def apply_smoothing(net: Network, smooth: dict[str, torch.Tensor], readers: dict[str, list[Candidate]]) -> dict:
    """Insert x' = x · (1/s) before the readers of each x in `smooth` and scale their weights' rows by s, in place;
    x → x' (the tensors calibration must now observe)."""
    renamed, at = {}, {}
    for x, s in smooth.items():
        inv = net.unique_name(f"{x}_smooth_inv")
        net.add_constant(inv, (1.0 / s.double()).float())
        xs = net.unique_name(f"{x}_smoothed")
        net.add_tensor(xs, DType.FLOAT32, net.tensors[x].shape)
        first = min(net.layers.index(c.layer) for c in readers[x])
        at.setdefault(first, []).append(Layer(net.unique_name(f"{x}_smooth"), "Mul", [x, inv], [xs], {}, origin=[]))
        for c in readers[x]:
            w = net.constants[c.weight].float()
            shape = [1] * w.dim()
            shape[1 - c.out_axis] = -1
            scaled = net.unique_name(f"{c.weight}_smoothed")
            net.add_constant(scaled, (w * s.reshape(shape)).contiguous())
            c.layer.inputs = [xs if i == 0 else (scaled if i == 1 else n) for i, n in enumerate(c.layer.inputs)]
        renamed[x] = xs
    net.layers = [m for i, layer in enumerate(net.layers) for m in at.get(i, []) + [layer]]
    return renamed
