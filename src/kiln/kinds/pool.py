"""Reference implementations of the pooling kinds.

Windowed pools (MaxPool, AveragePool, LpPool) carry kernel_shape [n], strides [n], dilations [n],
pads [2n] ([begins..., ends...]), auto_pad ("NOTSET" once pads are explicit), ceil_mode int, and:
  AveragePool: count_include_pad int;  MaxPool: storage_order int (Indices output);  LpPool: p int.
Output sizes follow ONNX: floor or ceil of (in + pads - span) / stride + 1, where in ceil mode the
last window must start inside the input or its begin padding.
"""

from __future__ import annotations

import math

import torch

from kiln.kinds.conv import compute_dtype, pad_spatial, resolve_pads
from kiln.kinds.registry import FLOAT, INT, INTS, STR, kind


def _out_size(size: int, k: int, s: int, d: int, begin: int, end: int, ceil: bool) -> int:
    span = (k - 1) * d + 1
    out = (size + begin + end - span) / s + 1
    if not ceil:
        return int(math.floor(out))
    out = int(math.ceil(out))
    return out - 1 if (out - 1) * s >= size + begin else out


def _geometry(x: torch.Tensor, attrs: dict) -> tuple[list[int], list[int]]:
    """(declared pads, pads that make the input exactly cover every output window; ends may differ)."""
    pads = resolve_pads(x.shape[2:], attrs)
    n = len(pads) // 2
    covering = list(pads)
    for i, (size, k, s, d) in enumerate(zip(x.shape[2:], attrs["kernel_shape"], attrs["strides"], attrs["dilations"])):
        out = _out_size(size, k, s, d, pads[i], pads[n + i], bool(attrs.get("ceil_mode", 0)))
        covering[n + i] = (out - 1) * s + (k - 1) * d + 1 - size - pads[i]
    return pads, covering


def _windows(x: torch.Tensor, attrs: dict) -> torch.Tensor:
    """(N, C, *spatial) → (N, C, *out, *kernel) view of every pooling window (x already padded)."""
    for i, (k, s, d) in enumerate(zip(attrs["kernel_shape"], attrs["strides"], attrs["dilations"])):
        x = x.unfold(2 + i, (k - 1) * d + 1, s)[..., ::d]
    return x


def _lowest(dtype: torch.dtype) -> float:
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


@kind("MaxPool", attrs={"auto_pad": STR, "ceil_mode": INT, "dilations": INTS.req, "kernel_shape": INTS.req,
                        "pads": INTS.req, "storage_order": INT, "strides": INTS.req})
def max_pool(inputs, attrs):
    """ONNX MaxPool; returns (Y, Indices) where Indices are int64 flat positions in X (per storage_order). fp8
    pools in fp32 (e4m3 has no -inf to pad with; the maximum is exact)."""
    x = inputs[0]
    if x.dtype == torch.float8_e4m3fn:
        values, index = max_pool([x.float()], attrs)
        return values.to(x.dtype), index
    pads, covering = _geometry(x, attrs)
    n = x.dim() - 2
    win = _windows(pad_spatial(x, covering, _lowest(x.dtype)), attrs)
    values, flat_k = win.flatten(-n).max(-1)
    # the input coordinate of each maximum, per spatial dim, then the flat index over the whole tensor
    spatial = x.shape[2:]
    index = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(*x.shape[:2], *[1] * n)
    strides = [1] * n
    order = range(n) if attrs.get("storage_order", 0) else reversed(range(n))
    step = 1
    for i in order:
        strides[i], step = step, step * spatial[i]
    index = index * step
    for i in reversed(range(n)):
        k = attrs["kernel_shape"][i]
        tap, flat_k = flat_k % k, flat_k // k
        out = torch.arange(values.shape[2 + i], device=x.device).reshape(-1, *[1] * (n - 1 - i))
        index = index + (out * attrs["strides"][i] + tap * attrs["dilations"][i] - pads[i]) * strides[i]
    return values, index


@kind("AveragePool", attrs={"auto_pad": STR, "ceil_mode": INT, "count_include_pad": INT, "dilations": INTS.req,
                            "kernel_shape": INTS.req, "pads": INTS.req, "strides": INTS.req})
def average_pool(inputs, attrs):
    """ONNX AveragePool; the divisor counts input elements, plus declared padding if count_include_pad."""
    x = inputs[0]
    pads, covering = _geometry(x, attrs)
    dt, n = compute_dtype(x.dtype), x.dim() - 2
    sums = _windows(pad_spatial(x.to(dt), covering), attrs).flatten(-n).sum(-1)
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=dt, device=x.device)
    if attrs.get("count_include_pad", 0):
        ones = pad_spatial(ones, pads, 1.0)
        covering = [c - p for c, p in zip(covering, pads)]
    counts = _windows(pad_spatial(ones, covering), attrs).flatten(-n).sum(-1)
    return (sums / counts).to(x.dtype)


@kind("LpPool", attrs={"auto_pad": STR, "ceil_mode": INT, "dilations": INTS.req, "kernel_shape": INTS.req, "p": INT.req,
                       "pads": INTS.req, "strides": INTS.req})
def lp_pool(inputs, attrs):
    """ONNX LpPool: (Σ |x|^p)^(1/p) over each window, padding reading as zero."""
    x = inputs[0]
    _, covering = _geometry(x, attrs)
    dt, n, p = compute_dtype(x.dtype), x.dim() - 2, float(attrs["p"])
    win = _windows(pad_spatial(x.to(dt).abs() ** p, covering), attrs)
    return (win.flatten(-n).sum(-1) ** (1 / p)).to(x.dtype)


@kind("GlobalAveragePool", attrs={})
def global_average_pool(inputs, attrs):
    """Mean over all spatial dims, kept as size-1 dims."""
    x = inputs[0]
    return x.to(compute_dtype(x.dtype)).mean(dim=tuple(range(2, x.dim())), keepdim=True).to(x.dtype)


@kind("GlobalMaxPool", attrs={})
def global_max_pool(inputs, attrs):
    """Max over all spatial dims, kept as size-1 dims."""
    x = inputs[0]
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@kind("GlobalLpPool", attrs={"p": INT.req})
def global_lp_pool(inputs, attrs):
    """(Σ |x|^p)^(1/p) over all spatial dims, kept as size-1 dims."""
    x = inputs[0]
    dt, p = compute_dtype(x.dtype), float(attrs["p"])
    dims = tuple(range(2, x.dim()))
    return ((x.to(dt).abs() ** p).sum(dim=dims, keepdim=True) ** (1 / p)).to(x.dtype)


@kind("MaxUnpool", attrs={"kernel_shape": INTS.req, "pads": INTS.req, "strides": INTS.req})
def max_unpool(inputs, attrs):
    """ONNX MaxUnpool: inputs (X, I, optional output_shape); attrs kernel_shape, strides, pads.

    Scatters X into zeros of the default unpooled shape at the flat positions I, then places that
    at the origin of output_shape (when given).
    """
    x, index, out_shape = (inputs + [None] * 3)[:3]
    n = x.dim() - 2
    pads = attrs["pads"]
    shape = [*x.shape[:2], *[(size - 1) * s - pads[i] - pads[n + i] + k for i, (size, k, s) in
                             enumerate(zip(x.shape[2:], attrs["kernel_shape"], attrs["strides"]))]]
    y = torch.zeros(math.prod(shape), dtype=x.dtype, device=x.device)
    y[index.flatten()] = x.flatten()
    y = y.reshape(shape)
    if out_shape is None:
        return y
    target = [int(v) for v in out_shape.tolist()]
    return pad_spatial(y, [0] * n + [t - s for t, s in zip(target[2:], shape[2:])])


def _roi_samples(start: float, size: float, bins: int, grid: int, limit: int, dtype, device):
    """Sample coordinates of one RoI axis (bins·grid), clamped as ONNX does, with their validity."""
    step = size / bins
    coords = start + (torch.arange(bins * grid, dtype=dtype, device=device) + 0.5) * (step / grid)
    valid = (coords >= -1.0) & (coords <= limit)
    coords = coords.clamp(min=0)
    low = coords.floor().clamp(max=limit - 1)
    coords = torch.where(low >= limit - 1, low, coords)
    high = (low + 1).clamp(max=limit - 1)
    return low.long(), high.long(), coords - low, valid


@kind("RoiAlign", attrs={"coordinate_transformation_mode": STR.req, "mode": STR.req, "output_height": INT.req,
                         "output_width": INT.req, "sampling_ratio": INT.req, "spatial_scale": FLOAT.req})
def roi_align(inputs, attrs):
    """ONNX RoiAlign: inputs (X, rois [R, 4] as x1,y1,x2,y2, batch_indices [R]); attrs mode ("avg"|"max"),
    output_height, output_width, sampling_ratio, spatial_scale, coordinate_transformation_mode."""
    x, rois, batch_indices = inputs
    dt = torch.float64
    height, width = x.shape[2:]
    oh, ow, ratio = attrs["output_height"], attrs["output_width"], attrs["sampling_ratio"]
    half = attrs["coordinate_transformation_mode"] == "half_pixel"
    outs = []
    for roi, b in zip(rois.to(dt).tolist(), batch_indices.tolist()):
        x1, y1, x2, y2 = [v * attrs["spatial_scale"] - (0.5 if half else 0.0) for v in roi]
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        gh = ratio if ratio > 0 else math.ceil(rh / oh)
        gw = ratio if ratio > 0 else math.ceil(rw / ow)
        yl, yh, ly, vy = _roi_samples(y1, rh, oh, gh, height, dt, x.device)
        xl, xh, lx, vx = _roi_samples(x1, rw, ow, gw, width, dt, x.device)
        img = x[int(b)].to(dt)
        valid = (vy[:, None] & vx[None, :]).to(dt)
        corners = [img[:, yy][:, :, xx] * (wy[:, None] * wx[None, :] * valid)
                   for yy, wy in ((yl, 1 - ly), (yh, ly)) for xx, wx in ((xl, 1 - lx), (xh, lx))]
        if attrs["mode"] == "max":
            v = torch.stack(corners).amax(0).reshape(-1, oh, gh, ow, gw).amax((2, 4))
        else:
            v = sum(corners).reshape(-1, oh, gh, ow, gw).sum((2, 4)) / max(gh * gw, 1)
        outs.append(v)
    if not outs:
        return torch.zeros((0, x.shape[1], oh, ow), dtype=x.dtype, device=x.device)
    return torch.stack(outs).to(x.dtype)
