"""Reference implementations of the ai.onnx.preview.training optimizers: Momentum, Adagrad, Adam.

Inputs are `[R, T, X1..Xn, G1..Gn, S1..Sn, ...]` (learning rate, update count, then each group of
n tensors); outputs are the new X1..Xn followed by the new state tensors, as in the ONNX spec.
Arithmetic runs in at least float32 and each output keeps its input's dtype.
"""

from __future__ import annotations

import torch

from kiln.kinds.normalization import compute_dtype
from kiln.kinds.registry import FLOAT, STR, kind


def _groups(inputs: list, n_groups: int) -> tuple[float, int, list[list[torch.Tensor]]]:
    """(R, T, [X..., G..., state...]) with each group widened to the compute dtype."""
    r, t, *rest = inputs
    n = len(rest) // n_groups
    ct = compute_dtype(*rest)
    return float(r), int(t), [[x.to(ct) for x in rest[i * n:(i + 1) * n]] for i in range(n_groups)]


def _cast_like(outs: list[torch.Tensor], like: list[torch.Tensor]) -> list[torch.Tensor]:
    return [o.to(i.dtype) for o, i in zip(outs, like)]


@kind("Momentum", attrs={"alpha": FLOAT.req, "beta": FLOAT.req, "mode": STR.req, "norm_coefficient": FLOAT.req})
def momentum(inputs, attrs):
    """SGD with standard or Nesterov momentum; beta is 1 on the first update (T = 0)."""
    r, t, (xs, gs, vs) = _groups(inputs, 3)
    alpha, norm = attrs["alpha"], attrs["norm_coefficient"]
    beta = attrs["beta"] if t > 0 else 1.0
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = norm * x + g
        v = alpha * v + beta * g
        new_x.append(x - r * (g + alpha * v if attrs["mode"] == "nesterov" else v))
        new_v.append(v)
    return _cast_like(new_x + new_v, inputs[2:])


@kind("Adagrad", attrs={"decay_factor": FLOAT, "epsilon": FLOAT, "norm_coefficient": FLOAT})
def adagrad(inputs, attrs):
    """ADAGRAD with learning rate R / (1 + T·decay_factor)."""
    r, t, (xs, gs, hs) = _groups(inputs, 3)
    rate = r / (1 + t * attrs.get("decay_factor", 0.0))
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = attrs.get("norm_coefficient", 0.0) * x + g
        h = h + g * g
        new_x.append(x - rate * g / (h.sqrt() + attrs.get("epsilon", 1e-6)))
        new_h.append(h)
    return _cast_like(new_x + new_h, inputs[2:])


@kind("Adam", attrs={"alpha": FLOAT, "beta": FLOAT, "epsilon": FLOAT, "norm_coefficient": FLOAT,
                     "norm_coefficient_post": FLOAT})
def adam(inputs, attrs):
    """Adam with bias correction from the second update on, and optional post-update decay."""
    r, t, (xs, gs, vs, hs) = _groups(inputs, 4)
    alpha, beta = attrs.get("alpha", 0.9), attrs.get("beta", 0.999)
    rate = r * (1 - beta**t) ** 0.5 / (1 - alpha**t) if t > 0 else r
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = attrs.get("norm_coefficient", 0.0) * x + g
        v = alpha * v + (1 - alpha) * g
        h = beta * h + (1 - beta) * g * g
        x = x - rate * v / (h.sqrt() + attrs.get("epsilon", 1e-6))
        new_x.append((1 - attrs.get("norm_coefficient_post", 0.0)) * x)
        new_v.append(v)
        new_h.append(h)
    return _cast_like(new_x + new_v + new_h, inputs[2:])
