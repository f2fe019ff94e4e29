"""Reference implementations of the shape layer kinds.

Shape-like inputs (shapes, axes, pads, repeats) arrive as int64 tensors at run time; attributes
hold only what is fixed at build time.
"""

from __future__ import annotations

import math

import torch

from kiln.errors import InputError
from kiln.kinds.registry import DTYPE, FLOAT, INT, INTS, STR, TENSOR, kind
from kiln.util.npyio import host_memory


def ints(t: torch.Tensor | None) -> list[int] | None:
    """A run-time integer tensor (or None) as a flat Python list."""
    return None if t is None else [int(v) for v in t.reshape(-1).tolist()]


def device_memory(device: torch.device) -> int:
    """Bytes one tensor may take on `device`: its memory (host RAM for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return host_memory()


def checked_shape(shape, dtype: torch.dtype, device: torch.device, what: str) -> list[int]:
    """A shape computed from run-time data as non-negative ints whose tensor fits `device`, else an InputError."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise InputError(f"{what} asks for an output of shape {dims}, with a negative dimension")
    need = math.prod(dims) * dtype.itemsize
    if need > device_memory(device):
        raise InputError(f"{what} asks for an output of shape {dims} ({need} bytes), over the memory budget of "
                         f"{device_memory(device)} bytes on {device}; feed smaller values")
    return dims


def axis_of(axis: int, rank: int) -> int:
    """An ONNX axis (negative counts from the end) as a non-negative index."""
    return axis + rank if axis < 0 else axis


@kind("Reshape", attrs={"allowzero": INT, "consumed_inputs": INTS, "shape": INTS})
def reshape(inputs, attrs):
    x, shape = inputs[0], ints(inputs[1])
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


@kind("Transpose", attrs={"perm": INTS})
def transpose(inputs, attrs):
    x = inputs[0]
    perm = attrs.get("perm") or list(range(x.dim()))[::-1]
    return x.permute(perm).contiguous()


@kind("Concat", attrs={"axis": INT.req})
def concat(inputs, attrs):
    xs = [x for x in inputs if x is not None]
    return torch.cat(xs, dim=axis_of(attrs["axis"], xs[0].dim()))


@kind("Split", attrs={"axis": INT, "num_outputs": INT.req, "split": INTS})
def split(inputs, attrs):
    """Split by the `split` sizes, else into `num_outputs` parts of ceil(dim / n), the last smaller."""
    x = inputs[0]
    axis = axis_of(attrs.get("axis", 0), x.dim())
    sizes = ints(inputs[1] if len(inputs) > 1 else None)
    if not sizes:
        n = attrs["num_outputs"]
        chunk = -(-x.shape[axis] // n)
        sizes = [chunk] * (n - 1) + [x.shape[axis] - chunk * (n - 1)]
    return list(torch.split(x, sizes, dim=axis))


def _slice_axis(x: torch.Tensor, axis: int, start: int, end: int, step: int) -> torch.Tensor:
    """One axis of ONNX Slice, with its clamping rules for out-of-range starts and ends."""
    dim = x.shape[axis]
    start, end = (start + dim if start < 0 else start), (end + dim if end < 0 else end)
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return x[(slice(None),) * axis + (slice(start, end, step),)]
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return x.index_select(axis, torch.arange(start, end, step, device=x.device))


@kind("Slice", attrs={"axes": INTS, "ends": INTS, "starts": INTS})
def slice_(inputs, attrs):
    x, starts, ends = inputs[0], ints(inputs[1]), ints(inputs[2])
    axes = ints(inputs[3] if len(inputs) > 3 else None) or list(range(len(starts)))
    steps = ints(inputs[4] if len(inputs) > 4 else None) or [1] * len(starts)
    for a, s, e, st in zip(axes, starts, ends, steps):
        x = _slice_axis(x, axis_of(a, x.dim()), s, e, st)
    return x


@kind("Squeeze", attrs={"axes": INTS})
def squeeze(inputs, attrs):
    x = inputs[0]
    axes = ints(inputs[1] if len(inputs) > 1 else None)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    return x.squeeze(tuple(axis_of(a, x.dim()) for a in axes)) if axes else x


@kind("Unsqueeze", attrs={"axes": INTS})
def unsqueeze(inputs, attrs):
    x, axes = inputs[0], ints(inputs[1])
    rank = x.dim() + len(axes)
    for a in sorted(axis_of(a, rank) for a in axes):
        x = x.unsqueeze(a)
    return x


@kind("Flatten", attrs={"axis": INT})
def flatten(inputs, attrs):
    x = inputs[0]
    axis = axis_of(attrs.get("axis", 1), x.dim())
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@kind("Expand", attrs={})
def expand(inputs, attrs):
    x, shape = inputs[0], ints(inputs[1])
    if any(d < 0 for d in shape):
        raise InputError(f"Expand asks for shape {shape}, with a negative dimension")
    out = checked_shape(torch.broadcast_shapes(x.shape, tuple(shape)), x.dtype, x.device, "Expand")
    return x.expand(out).contiguous()


@kind("Tile", attrs={})
def tile(inputs, attrs):
    x, repeats = inputs[0], ints(inputs[1])
    if len(repeats) == x.dim():
        checked_shape([d * r for d, r in zip(x.shape, repeats)], x.dtype, x.device, "Tile")
    return x.repeat(repeats)


def _pad_index(n: int, before: int, after: int, mode: str, device) -> torch.Tensor:
    """Source index of each position of a padded axis of length n (edge, reflect or wrap)."""
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return i.remainder(n)
    period = 2 * (n - 1)
    i = i.remainder(period) if period else torch.zeros_like(i)
    return torch.where(i < n, i, period - i)


def pad_axes(x: torch.Tensor, axes: list[int], pads: list[int], mode: str = "constant", fill=0) -> torch.Tensor:
    """Pad (or crop, for negative pads) each axis by pads[i] before and pads[len(axes) + i] after."""
    n = len(axes)
    for axis, before, after in zip(axes, pads[:n], pads[n:]):
        x = x.narrow(axis, max(-before, 0), x.shape[axis] - max(-before, 0) - max(-after, 0))
        before, after = max(before, 0), max(after, 0)
        if not (before or after):
            continue
        if mode == "constant":
            parts = []
            for size in (before, after):
                shape = list(x.shape)
                shape[axis] = size
                parts.append(torch.full(shape, fill, dtype=x.dtype, device=x.device))
            x = torch.cat([parts[0], x, parts[1]], dim=axis)
        else:
            x = x.index_select(axis, _pad_index(x.shape[axis], before, after, mode, x.device))
    return x


@kind("Pad", attrs={"mode": STR, "paddings": INTS, "pads": INTS, "value": FLOAT})
def pad(inputs, attrs):
    x, pads = inputs[0], ints(inputs[1])
    value = inputs[2] if len(inputs) > 2 else None
    axes = ints(inputs[3] if len(inputs) > 3 else None)
    axes = [axis_of(a, x.dim()) for a in axes] if axes is not None else list(range(x.dim()))
    if len(pads) == 2 * len(axes):
        grown = dict(zip(axes, (x.shape[a] + p + q for a, p, q in zip(axes, pads, pads[len(axes):]))))
        checked_shape([grown.get(i, d) for i, d in enumerate(x.shape)], x.dtype, x.device, "Pad")
    fill = value.reshape(()).item() if value is not None and value.numel() else 0
    return pad_axes(x, axes, pads, attrs.get("mode", "constant"), fill)


@kind("Shape", attrs={"end": INT, "start": INT})
def shape(inputs, attrs):
    dims = list(inputs[0].shape)
    rank = len(dims)
    clamp = lambda v: min(max(axis_of(v, rank), 0), rank)  # noqa: E731  (ONNX Shape clamps)
    end = attrs.get("end")
    return torch.tensor(dims[clamp(attrs.get("start", 0) or 0):clamp(rank if end is None else end)],
                        dtype=torch.int64, device=inputs[0].device)


@kind("Size", attrs={})
def size(inputs, attrs):
    return torch.tensor(inputs[0].numel(), dtype=torch.int64, device=inputs[0].device)


@kind("ConstantOfShape", attrs={"value": TENSOR.req})
def constant_of_shape(inputs, attrs):
    value = attrs["value"]
    shape = checked_shape(ints(inputs[0]), value.dtype, inputs[0].device, "ConstantOfShape")
    return torch.full(shape, value.reshape(-1)[0].item(), dtype=value.dtype, device=inputs[0].device)


@kind("Range", attrs={"stash_type": INT})
def range_(inputs, attrs):
    """start + i * delta for i < ceil((limit - start) / delta); fp16/bf16 computed in fp32 if stashed."""
    start, limit, delta = inputs
    dtype = start.dtype
    span, step = limit.item() - start.item(), delta.item()
    if not (math.isfinite(span) and math.isfinite(step)) or step == 0:
        raise InputError(f"Range(start={start.item()}, limit={limit.item()}, delta={step}) has no finite length; "
                         "start, limit and delta must be finite and delta non-zero")
    n = checked_shape([max(math.ceil(span / step), 0)], dtype, start.device, "Range")[0]
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) and attrs.get("stash_type", 1) == 1 else dtype
    i = torch.arange(n, dtype=compute, device=start.device)
    return (start.to(compute) + i * delta.to(compute)).to(dtype)


@kind("EyeLike", attrs={"dtype": DTYPE.req, "k": INT})
def eye_like(inputs, attrs):
    out = torch.zeros(inputs[0].shape, dtype=attrs["dtype"].torch, device=inputs[0].device)
    out.diagonal(attrs.get("k", 0)).fill_(1)
    return out


@kind("Trilu", attrs={"upper": INT})
def trilu(inputs, attrs):
    k = inputs[1].item() if len(inputs) > 1 and inputs[1] is not None else 0
    x = inputs[0]
    keep = torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device)
    keep = keep.triu(k) if attrs.get("upper", 1) else keep.tril(k)
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


@kind("DepthToSpace", attrs={"blocksize": INT.req, "mode": STR})
def depth_to_space(inputs, attrs):
    x, b = inputs[0], attrs["blocksize"]
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return t.reshape(n, c // (b * b), h * b, w * b)


@kind("SpaceToDepth", attrs={"blocksize": INT.req, "mode": STR})
def space_to_depth(inputs, attrs):
    x, b = inputs[0], attrs["blocksize"]
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    t = t.permute(0, 3, 5, 1, 2, 4) if attrs.get("mode", "DCR") == "DCR" else t.permute(0, 1, 3, 5, 2, 4)
    return t.reshape(n, c * b * b, h // b, w // b)


@kind("CenterCropPad", attrs={"axes": INTS})
def center_crop_pad(inputs, attrs):
    """Crop or zero-pad each listed axis to its target length, keeping the centre."""
    x, target = inputs[0], ints(inputs[1])
    axes = [axis_of(a, x.dim()) for a in (attrs.get("axes") or range(x.dim()))]
    diffs = [want - x.shape[a] for a, want in zip(axes, target)]
    befores = [d // 2 if d >= 0 else -(-d // 2) for d in diffs]
    return pad_axes(x, axes, befores + [d - b for d, b in zip(diffs, befores)])
