"""Checking and converting inference inputs (numpy, torch, DLPack) against what an engine expects."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch

from kiln.config import Profile
from kiln.errors import InputError, ModelError
from kiln.ir import DType, Network, Tensor
from kiln.ir.dtype import move, shell_carrier, to_torch


# numpy dtypes torch.from_numpy takes as they are; others (ml_dtypes, strings) go through to_torch
_TORCH_NATIVE = {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float16", "float32", "float64", "complex64", "complex128"}


def as_torch(name: str, value: Any) -> tuple[torch.Tensor | np.ndarray, bool]:
    """(runtime value, was_numpy) for a numpy array, torch tensor or DLPack object; no copy where possible.

    ml_dtypes arrays (bf16, fp8, fp4, int4, ...) are converted as `to_torch` does; string arrays stay
    numpy object arrays, kiln's runtime form of STRING tensors.
    """
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise InputError(f"input {name!r} is a meta tensor, which holds no data; pass a tensor on the CPU or "
                             "the engine's device")
        return value, False
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        if not value.dtype.isnative:  # big-endian data (from another machine's file): torch takes native order only
            value = value.astype(value.dtype.newbyteorder("="))
        if value.dtype.name not in _TORCH_NATIVE or not value.flags.writeable:
            try:
                return to_torch(value), True
            except ModelError as e:
                raise InputError(f"input {name!r}: {e}") from None
        return torch.from_numpy(np.ascontiguousarray(value) if value.ndim else value), True
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value), False
    raise InputError(f"input {name!r}: expected a numpy array, torch tensor or DLPack object, "
                     f"got {type(value).__name__}")


def check_feeds(feeds: Mapping[str, Any], inputs: list[Tensor], profiles: tuple[Profile, ...]
                ) -> tuple[dict[str, torch.Tensor], bool]:
    """Validate names, dtypes and shapes; return torch tensors and whether the caller used numpy."""
    expected = [t.name for t in inputs]
    missing = [n for n in expected if n not in feeds]
    extra = [n for n in feeds if n not in expected]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        raise InputError(f"wrong inputs: {', '.join(parts)}; the engine expects {expected}")
    out, any_numpy = {}, False
    for t in inputs:
        value, was_numpy = as_torch(t.name, feeds[t.name])
        any_numpy |= was_numpy
        try:
            got = DType.from_torch(value.dtype)
        except ModelError:
            got = value.dtype
        if got != t.dtype:
            raise InputError(f"input {t.name!r}: expected dtype {t.dtype}, got {got}")
        shape = tuple(value.shape)
        if t.shape is not None:
            if len(shape) != len(t.shape):
                raise InputError(f"input {t.name!r}: expected rank {len(t.shape)} (shape {t.shape_str()}), "
                                 f"got shape {list(shape)}")
            for d, want in zip(shape, t.shape):
                if isinstance(want, int) and d != want:
                    raise InputError(f"input {t.name!r}: expected shape {t.shape_str()}, got {list(shape)}")
        out[t.name] = value
    if profiles:
        _check_profiles({k: tuple(v.shape) for k, v in out.items()}, profiles)
    return out, any_numpy


def _check_profiles(shapes: dict[str, tuple], profiles: tuple[Profile, ...]) -> int:
    for index, p in enumerate(profiles):
        if all(r.contains(shapes[n]) for n, r in p.items() if n in shapes):
            return index
    raise outside_profiles(shapes, profiles)


def outside_profiles(shapes: dict[str, tuple], profiles: tuple[Profile, ...]) -> InputError:
    """The error for input `shapes` that fit none of `profiles`, naming every profile's range."""
    ranges = "; ".join(f"profile {i}: " + ", ".join(f"{n} {r}" for n, r in p.items()) for i, p in enumerate(profiles))
    got = ", ".join(f"{n} {'x'.join(map(str, s))}" for n, s in shapes.items())
    return InputError(f"input shapes ({got}) are outside every optimization profile ({ranges}); "
                      "rebuild with --profile (or --min-shapes/--max-shapes) covering them")


def select_profile(shapes: dict[str, tuple], profiles: tuple[Profile, ...]) -> int:
    """The profile whose ranges hold `shapes` (inputs a profile does not name are not checked); of several, the
    one whose opt shapes are nearest (least summed |log ratio| per dimension), the lowest index on ties.
    0 when there are no profiles; an InputError naming every profile's range when none holds them."""
    if not profiles:
        return 0

    def distance(p: Profile) -> float:
        return sum(abs(math.log((d + 1) / (o + 1))) for n, r in p.items() if n in shapes
                   for d, o in zip(shapes[n], r.opt))

    fits = [k for k, p in enumerate(profiles) if all(r.contains(shapes[n]) for n, r in p.items() if n in shapes)]
    if not fits:
        raise outside_profiles(shapes, profiles)
    return min(fits, key=lambda k: (distance(profiles[k]), k))


# kind → its (index input, table input) positions: a Gather's, and a fused embedding's lookups (kinds/fused.py)
INDEX_READERS = {"Gather": ((1, 0),), "EmbedLayerNorm": ((0, 1), (2, 3), (4, 5))}


def index_bounds(net: Network) -> dict[str, tuple[int, str]]:
    """Integer inputs a Gather or a fused embedding lookup reads as indices into a constant table (embeddings):
    input → (the table's rows along the gathered axis, the layer's name), the smallest table where several read one
    input."""
    bounds: dict[str, tuple[int, str]] = {}
    for layer in net.layers:
        for at, table_at in INDEX_READERS.get(layer.kind, ()):
            ids, table = (layer.inputs[k] if k < len(layer.inputs) else None for k in (at, table_at))
            if ids not in net.inputs or table not in net.constants:
                continue
            t = net.constants[table]
            rows = t.shape[layer.attrs.get("axis", 0) % t.dim() if layer.kind == "Gather" else 0] if t.dim() else 0
            if rows < bounds.get(ids, (rows + 1,))[0]:
                bounds[ids] = (rows, layer.name)
    return bounds


def check_indices(tensors: dict[str, Any], bounds: dict[str, tuple[int, str]]) -> None:
    """Host-resident index inputs (CPU tensors or numpy arrays) must lie in [-rows, rows) of the tables they index
    (a lookup out of range fails on the CPU, traps the GPU or reads zeros there); device tensors are trusted, not read
    back, as TensorRT does."""
    for name, (rows, layer) in bounds.items():
        v = tensors.get(name)
        if isinstance(v, np.ndarray) and v.size and v.dtype.kind in "iu":
            lo, hi = int(v.min()), int(v.max())
        elif isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.numel():
            lo, hi = (int(x) for x in torch.aminmax(v))
        else:
            continue
        if lo < -rows or hi >= rows:
            raise InputError(f"input {name!r}: values must be in [{-rows}, {rows}) (it indexes a table of {rows} "
                             f"rows in layer {layer!r}), got values from {lo} to {hi}")


def check_byte_length(name: str, data: bytes, dtype: DType, shape: tuple[int, ...]) -> None:
    """For raw buffers (CLI, server): byte length must equal prod(shape) × itemsize."""
    want = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if len(data) != want:
        raise InputError(f"input {name!r}: {len(data)} bytes given, but shape {list(shape)} of {dtype} "
                         f"needs {want} bytes")


def upload(value: Any, device: str | torch.device) -> Any:
    """A host tensor onto a CUDA `device` through a pinned staging buffer, asynchronously on the current stream.

    Pinned blocks come from torch's caching host allocator, which holds each one until the copies issued
    from it have finished; a pinned tensor is copied from directly (its owner keeps it unchanged until the copy is
    done); device tensors, strings and None are returned as they are.
    """
    device = torch.device(device)
    if isinstance(value, list):
        return [upload(v, device) for v in value]
    if not isinstance(value, torch.Tensor) or device.type != "cuda":
        return value
    if value.is_cuda:
        return move(value, device)
    carrier = shell_carrier(value.dtype)
    if carrier is not None:  # torch copies its sub-byte shell dtypes only as their carrier bytes
        return upload(value.view(carrier), device).view(value.dtype)
    if value.is_pinned():  # already page-locked (a serving batch's staging block): no second copy
        return value.to(device, non_blocking=True)
    staging = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
    staging.copy_(value)
    return staging.to(device, non_blocking=True)


def fetch(value: Any) -> Any:
    """Start a device tensor's copy into a pinned host buffer on the current stream (read it after the stream
    has been synchronized); other values are returned as they are."""
    if isinstance(value, list):
        return [fetch(v) for v in value]
    if not isinstance(value, torch.Tensor) or not value.is_cuda:
        return value
    host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
    host.copy_(value, non_blocking=True)
    return host


def check_bound(outputs: Mapping[str, Any] | None, names: list[str], device: torch.device) -> dict[str, torch.Tensor]:
    """Preallocated output tensors, checked: each names an engine output and is a tensor on the engine's device."""
    if outputs is None:
        return {}
    if not isinstance(outputs, Mapping):
        raise InputError(f"outputs must be a dict of output name → preallocated tensor, got {type(outputs).__name__}")
    for name, buf in outputs.items():
        if name not in names:
            raise InputError(f"outputs names {name!r}, which is not an output of this engine; its outputs are {names}")
        if not isinstance(buf, torch.Tensor) or not same_device(buf.device, torch.device(device)):
            raise InputError(f"output {name!r}: bind a torch tensor on {device}, got "
                             f"{buf.device if isinstance(buf, torch.Tensor) else type(buf).__name__}")
    return dict(outputs)


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one ("cuda" is the current CUDA device)."""
    index = lambda d: d.index if d.index is not None or d.type != "cuda" else torch.cuda.current_device()  # noqa: E731
    return a.type == b.type and index(a) == index(b)


def bind_outputs(result: dict[str, Any], bound: Mapping[str, torch.Tensor],
                 converts: Mapping[str, torch.dtype] | None = None) -> dict[str, Any]:
    """`result` with the bound outputs written into their preallocated tensors (which must match exactly);
    `converts`: outputs whose value is converted to that dtype as it is written (a graph's folded output Casts)."""
    converts = converts or {}
    for name, buf in bound.items():
        value = result[name]
        if not isinstance(value, torch.Tensor) or value.shape != buf.shape or \
                converts.get(name, value.dtype) != buf.dtype:
            got = f"{converts.get(name, value.dtype)}{list(value.shape)}" if isinstance(value, torch.Tensor) \
                else type(value).__name__
            raise InputError(f"output {name!r} is {got} for these inputs, but the tensor bound to it is "
                             f"{buf.dtype}{list(buf.shape)}; bind a tensor of that dtype and shape")
        buf.copy_(value)
        result[name] = buf
    return result
