"""Reference implementations of resampling kinds: Resize, GridSample, AffineGrid, Col2Im.

Resize is separable: each resized axis maps every output position to a source coordinate, then
to a few source taps with weights (one tap for nearest), applied one axis after another.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from kiln.kinds.registry import FLOAT, INT, INTS, STR, kind
from kiln.kinds.shape import axis_of, ints


def _source_coords(attrs, out_len: int, scale: float, in_len: int, roi: tuple[float, float] | None):
    """Source coordinate of each output position (float64) and, for tf_crop_and_resize, the positions
    that fall outside the input. As in ONNX's reference (and its conformance data), length_resized is
    scale × length_original, fractional when the scale does not divide evenly; ONNX Runtime rounds it."""
    mode = attrs["coordinate_transformation_mode"]
    y = torch.arange(out_len, dtype=torch.float64)
    width = scale * in_len
    if mode == "tf_crop_and_resize":
        start, end = roi if roi is not None else (0.0, 1.0)
        if width == 1:
            x = torch.full_like(y, 0.5 * (start + end) * (in_len - 1))
        else:
            x = y * (end - start) * (in_len - 1) / (width - 1) + start * (in_len - 1)
        return x, (x < 0) | (x > in_len - 1)
    if mode == "align_corners":
        x = torch.zeros_like(y) if width == 1 else y * (in_len - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "pytorch_half_pixel":
        x = torch.full_like(y, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        x = in_len / 2 * (1 - out_len / width) + (y + 0.5) / scale - 0.5
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    else:
        x = (y + 0.5) / scale - 0.5
    return x, None


def _cubic(a: float):
    def k(x):
        x = x.abs()
        near = ((a + 2) * x - (a + 3)) * x * x + 1
        far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return torch.where(x <= 1, near, torch.where(x < 2, far, torch.zeros_like(x)))

    return k


def _taps(attrs, x: torch.Tensor, scale: float, in_len: int):
    """(source indices [out, n], weights [out, n] or None for nearest) for source coordinates x."""
    base = torch.ceil(x) - 1
    ratio = x - base  # in (0, 1]: the left tap is preferred on ties
    if attrs["mode"] == "nearest":
        mode = attrs["nearest_mode"]
        if mode == "simple":  # Resize-10 and Upsample (as ONNX Runtime defines them): floor up, ceil down
            mode = "floor" if scale >= 1 else "ceil"
        second = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                  "floor": ratio == 1, "ceil": torch.ones_like(ratio, dtype=torch.bool)}[mode]
        return (base + second).long().clamp(0, in_len - 1)[:, None], None
    linear = attrs["mode"] == "linear"
    kernel, support = ((lambda t: (1 - t.abs()).clamp(min=0)), 1) if linear else (_cubic(attrs["cubic_coeff_a"]), 2)
    stretch = min(scale, 1.0) if attrs["antialias"] else 1.0
    first = math.floor(-support / stretch) + 1
    offsets = torch.arange(first, 2 - first, dtype=torch.float64)
    w = kernel(stretch * (offsets - ratio[:, None]))
    if attrs["antialias"]:
        w = w / w.sum(1, keepdim=True)
    idx = (base[:, None] + offsets).long()
    if attrs["exclude_outside"]:
        w = torch.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(1, keepdim=True)
        w = w / torch.where(total == 0, 1.0, total)
    return idx.clamp(0, in_len - 1), w


def _resize_axis(x: torch.Tensor, axis: int, out_len: int, scale: float, roi, attrs) -> torch.Tensor:
    """Resample one axis of x (in a floating compute dtype, except nearest which copies values)."""
    coords, outside = _source_coords(attrs, out_len, scale, x.shape[axis], roi)
    idx, w = _taps(attrs, coords, scale, x.shape[axis])
    moved = x.movedim(axis, -1)
    g = moved[..., idx.to(x.device)]
    out = g[..., 0] if w is None else (g * w.to(x.device, x.dtype)).sum(-1)
    if outside is not None:
        out = torch.where(outside.to(x.device), torch.tensor(attrs["extrapolation_value"], dtype=x.dtype,
                                                             device=x.device), out)
    return out.movedim(-1, axis)


def _values(t: torch.Tensor | None) -> list | None:
    """A run-time tensor as a flat Python list, or None when it is absent or empty."""
    return t.reshape(-1).tolist() if t is not None and t.numel() else None


def _plan(shape, attrs, roi, scales, sizes):
    """(axis, output length, scale, roi pair) for each resized axis, from run-time scales or sizes."""
    rank = len(shape)
    axes = [axis_of(a, rank) for a in attrs.get("axes") or range(rank)]
    if sizes:
        ratios = [s / shape[a] for a, s in zip(axes, sizes)]
        policy = attrs["keep_aspect_ratio_policy"]
        if policy != "stretch":
            keep = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [keep] * len(axes)
            sizes = [int(keep * shape[a] + 0.5) for a in axes]
        scales = ratios
    else:
        sizes = [int(s * shape[a]) for a, s in zip(axes, scales)]
    n = len(axes)
    pairs = [(roi[i], roi[n + i]) for i in range(n)] if roi else [None] * n
    return list(zip(axes, sizes, scales, pairs))


@kind("Resize", attrs={"antialias": INT.req, "axes": INTS, "coordinate_transformation_mode": STR.req,
                       "cubic_coeff_a": FLOAT.req, "exclude_outside": INT.req, "extrapolation_value": FLOAT.req,
                       "keep_aspect_ratio_policy": STR.req, "mode": STR.req, "nearest_mode": STR.req})
def resize(inputs, attrs):
    x = inputs[0]
    roi, scales, sizes = (_values(inputs[i] if len(inputs) > i else None) for i in (1, 2, 3))
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    if attrs["mode"] == "nearest" and attrs["coordinate_transformation_mode"] != "tf_crop_and_resize":
        work = x  # nearest copies values: exact for every dtype
    for axis, out_len, scale, pair in _plan(x.shape, attrs, roi, scales, sizes):
        if out_len == work.shape[axis] and math.isclose(scale, 1.0) and pair in (None, (0.0, 1.0)):
            continue
        work = _resize_axis(work, axis, out_len, scale, pair, attrs)
    if work.dtype == x.dtype:
        return work
    if not x.dtype.is_floating_point:
        info = torch.iinfo(x.dtype)
        work = work.round().clamp(info.min, info.max)
    return work.to(x.dtype)


_GRID_MODES = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


@kind("GridSample", attrs={"align_corners": INT.req, "mode": STR.req, "padding_mode": STR.req})
def grid_sample(inputs, attrs):
    """2-D and 3-D sampling at normalized grid locations (torch's grid_sample has ONNX's semantics)."""
    x, grid = inputs
    work = x if x.dtype.is_floating_point else x.to(grid.dtype)
    out = F.grid_sample(work, grid.to(work.dtype), mode=_GRID_MODES[attrs["mode"]],
                        padding_mode=attrs["padding_mode"], align_corners=bool(attrs["align_corners"]))
    return out.to(x.dtype)


@kind("AffineGrid", attrs={"align_corners": INT})
def affine_grid(inputs, attrs):
    theta, size = inputs[0], ints(inputs[1])
    return F.affine_grid(theta, size, align_corners=bool(attrs.get("align_corners", 0)))


@kind("Col2Im", attrs={"dilations": INTS, "pads": INTS, "strides": INTS})
def col2im(inputs, attrs):
    """Sum column blocks back into an N-D image: one strided add per kernel offset."""
    cols, image, block = inputs[0], ints(inputs[1]), ints(inputs[2])
    nd = len(image)
    dil = attrs.get("dilations") or [1] * nd
    strides = attrs.get("strides") or [1] * nd
    pads = attrs.get("pads") or [0] * (2 * nd)
    padded = [image[i] + pads[i] + pads[nd + i] for i in range(nd)]
    counts = [(padded[i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    n, c = cols.shape[0], cols.shape[1] // math.prod(block)
    cols = cols.reshape(n, c, *block, *counts)
    out = cols.new_zeros(n, c, *padded)
    for k in itertools.product(*map(range, block)):
        region = tuple(slice(k[i] * dil[i], k[i] * dil[i] + strides[i] * (counts[i] - 1) + 1, strides[i])
                       for i in range(nd))
        out[(..., *region)] += cols[(slice(None), slice(None), *k)]
    return out[(..., *(slice(pads[i], pads[i] + image[i]) for i in range(nd)))]
