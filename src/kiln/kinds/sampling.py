"""Reference implementations of the random kinds (not pure: never constant-folded).

With a `seed` attribute every run draws the same values (a fresh generator seeded with it);
without one, each run draws from torch's global generator. Samples are drawn in fp32 (fp64 for
fp64 outputs) and cast to the output type.
"""

from __future__ import annotations

import torch

from kiln.kinds.registry import DTYPE, FLOAT, INT, NONE, kind


def _generator(attrs: dict, device) -> torch.Generator | None:
    if attrs.get("seed") is None:
        return None
    g = torch.Generator(device=device or "cpu")
    g.manual_seed(int(attrs["seed"]))
    return g


def _sample_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _draw(shape, attrs: dict, device) -> torch.Tensor:
    """Uniform [low, high) or normal (mean, scale) values of `shape` in the output dtype."""
    out = attrs["dtype"].torch
    opts = dict(dtype=_sample_dtype(out), device=device, generator=_generator(attrs, device))
    if "mean" in attrs:
        x = torch.randn(shape, **opts) * attrs["scale"] + attrs["mean"]
    else:
        x = torch.rand(shape, **opts) * (attrs["high"] - attrs["low"]) + attrs["low"]
    return x.to(out)


@kind("RandomUniform", "RandomNormal", pure=False,
      attrs={"dtype": DTYPE.req, "high": FLOAT, "low": FLOAT, "mean": FLOAT, "scale": FLOAT,
             "seed": (FLOAT | NONE).req})
def random_from_shape(inputs, attrs):
    """inputs: the output shape as a 1-D int64 tensor (a constant made from the `shape` attribute)."""
    return _draw(tuple(inputs[0].tolist()), attrs, inputs[0].device)


@kind("RandomUniformLike", "RandomNormalLike", pure=False, attrs={"dtype": DTYPE.req, "high": FLOAT, "low": FLOAT,
                                                                  "mean": FLOAT, "scale": FLOAT,
                                                                  "seed": (FLOAT | NONE).req})
def random_like(inputs, attrs):
    """inputs: a tensor whose shape (only) the output takes."""
    x = inputs[0]
    return _draw(tuple(x.shape), attrs, getattr(x, "device", None))


@kind("Bernoulli", pure=False, attrs={"dtype": DTYPE.req, "seed": (FLOAT | NONE).req})
def bernoulli(inputs, attrs):
    """1 with probability p (the input), else 0."""
    p = inputs[0]
    draw = torch.bernoulli(p.to(_sample_dtype(p.dtype)), generator=_generator(attrs, p.device))
    return draw.to(attrs["dtype"].torch)


@kind("Multinomial", pure=False, attrs={"dtype": DTYPE.req, "sample_size": INT.req, "seed": (FLOAT | NONE).req})
def multinomial(inputs, attrs):
    """inputs: unnormalized log-probabilities [batch, classes] → `sample_size` class indices per row."""
    x = inputs[0]
    probs = torch.softmax(x.to(_sample_dtype(x.dtype)), dim=-1)
    draw = torch.multinomial(probs, attrs["sample_size"], replacement=True, generator=_generator(attrs, x.device))
    return draw.to(attrs["dtype"].torch)
