"""Layout layers as views: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Slice, Expand, Gather of one
constant index and StridedView return a view of their input (no kernel, no copy) when shapes and indices are
known at build.

Every consumer reads its inputs through strides (torch ops; the Triton kernels take strides or copy
what they cannot read), the engine hands back contiguous outputs, and no kernel writes into its inputs,
so a view only ever aliases values that are read. Reshape copies only where no view of the input exists.
"""

from __future__ import annotations

from kiln.kinds.shape import axis_of
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

# dtypes whose elements are whole bytes (packed 4-bit types are left to the references)
_PLAIN = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def _plain(spec: LayerSpec, static: bool = True) -> str | None:
    """Why the layer is not a plain-dtype tensor layer with static shapes (with `static=False`: of known rank)."""
    x, y = spec.inputs[0], spec.outputs[0]
    if x is None or x.shape is None or y.shape is None or static and (not x.static or not y.static):
        return "input or output shape not static" if static else "input or output rank unknown"
    if x.dtype is None or x.dtype.value not in _PLAIN or y.dtype != x.dtype:
        return f"dtype {x.dtype} is not a plain tensor dtype"
    return None


def _consts(spec: LayerSpec, first: int) -> str | None:
    """Why inputs from `first` on are not all build-time constants (or absent), or None."""
    if any(v is not None and v.const is None for v in spec.inputs[first:]):
        return "shape/axes/indices are computed at run time"
    return None


def _ints(spec: LayerSpec, i: int) -> list[int] | None:
    v = spec.inputs[i] if len(spec.inputs) > i else None
    return None if v is None else [int(x) for x in v.const.reshape(-1).tolist()]


def _supports_static(spec: LayerSpec, device) -> str | None:
    return _plain(spec)


def _compile_reshape(spec: LayerSpec, config, device):
    """Reshape, Flatten, Squeeze, Unsqueeze: the static output shape says it all."""
    shape = tuple(spec.outputs[0].shape)
    return lambda inputs: [inputs[0].reshape(shape)]


def _supports_transpose(spec: LayerSpec, device) -> str | None:
    """A permutation is a view at any shape: symbolic dims too (a dynamic engine's head split and merge)."""
    return _plain(spec, static=False)


def _compile_transpose(spec: LayerSpec, config, device):
    rank = len(spec.inputs[0].shape)
    perm = tuple(spec.attrs.get("perm") or range(rank)[::-1])
    return lambda inputs: [inputs[0].permute(perm)]


def _supports_expand(spec: LayerSpec, device) -> str | None:
    return _plain(spec) or _consts(spec, 1)


def _compile_expand(spec: LayerSpec, config, device):
    shape = tuple(spec.outputs[0].shape)
    return lambda inputs: [inputs[0].expand(shape)]


def _slices(spec: LayerSpec) -> tuple | None:
    """Python slices (positive steps) equal to the layer's ONNX Slice, or None."""
    shape = spec.inputs[0].shape
    starts, ends = _ints(spec, 1), _ints(spec, 2)
    axes = _ints(spec, 3) or list(range(len(starts)))
    steps = _ints(spec, 4) or [1] * len(starts)
    index = [slice(None)] * len(shape)
    for a, s, e, st in zip(axes, starts, ends, steps):
        a = axis_of(a, len(shape))
        if st <= 0:
            return None
        dim = shape[a]
        s, e = (s + dim if s < 0 else s), (e + dim if e < 0 else e)
        index[a] = slice(min(max(s, 0), dim), min(max(e, 0), dim), st)
    return tuple(index)


def _supports_slice(spec: LayerSpec, device) -> str | None:
    reason = _plain(spec) or _consts(spec, 1)
    if reason:
        return reason
    return None if _slices(spec) is not None else "a negative step (a reversed copy)"


def _compile_slice(spec: LayerSpec, config, device):
    index = _slices(spec)
    return lambda inputs: [inputs[0][index]]


def _supports_gather(spec: LayerSpec, device) -> str | None:
    reason = _plain(spec) or _consts(spec, 1)
    if reason:
        return reason
    idx = spec.inputs[1].const
    if idx.dim() != 0 or idx.dtype.is_floating_point:
        return "index is not one constant integer"
    dim = spec.inputs[0].shape[axis_of(spec.attrs.get("axis", 0), len(spec.inputs[0].shape))]
    return None if -dim <= int(idx) < dim else "index out of range"


def _compile_gather(spec: LayerSpec, config, device):
    axis = axis_of(spec.attrs.get("axis", 0), len(spec.inputs[0].shape))
    index = int(spec.inputs[1].const)
    return lambda inputs: [inputs[0].select(axis, index)]


def _compile_strided(spec: LayerSpec, config, device):
    """StridedView: a view of a contiguous input; an input in another layout is made contiguous first (a copy)."""
    shape, strides, offset = spec.attrs["shape"], spec.attrs["strides"], spec.attrs["offset"]

    def run(inputs):
        x = inputs[0].contiguous()
        return [x.as_strided(shape, strides, x.storage_offset() + offset)]

    return run


for _name, _kinds, _compile, _supports in (
        ("view_reshape", ("Reshape", "Flatten", "Squeeze", "Unsqueeze"), _compile_reshape, _supports_static),
        ("view_transpose", ("Transpose",), _compile_transpose, _supports_transpose),
        ("view_expand", ("Expand",), _compile_expand, _supports_expand),
        ("view_slice", ("Slice",), _compile_slice, _supports_slice),
        ("view_gather", ("Gather",), _compile_gather, _supports_gather),
        ("view_strided", ("StridedView",), _compile_strided, _supports_static)):
    register(Tactic(_name, _kinds, _compile, _supports, priority=0, untimed=True))
