"""Reference implementations of the reduction kinds (ReduceSum ... ReduceLogSumExp, ArgMax, ArgMin).

Every Reduce kind takes `[data, axes?]` and attributes `axes` (list or None), `keepdims` and
`noop_with_empty_axes`; a runtime `axes` input wins over the attribute. The result keeps the
input's dtype, as ONNX requires, also for integer and bool inputs.
"""

from __future__ import annotations

import math

import torch

from kiln.kinds.registry import INT, INTS, NONE, kind

_HALF = (torch.float16, torch.bfloat16)
_WIDE_UINT = (torch.uint16, torch.uint32, torch.uint64)  # torch's CPU max/min/argmax lack kernels for these
_SIGN = -(2**63)


def reduce_dims(x: torch.Tensor, inputs: list, attrs: dict) -> tuple[int, ...]:
    """The dims to reduce, sorted and non-negative; () means no reduction (noop_with_empty_axes)."""
    axes = inputs[1].tolist() if len(inputs) > 1 and inputs[1] is not None else attrs.get("axes")
    if not axes:
        return () if attrs.get("noop_with_empty_axes") else tuple(range(x.dim()))
    rank = max(x.dim(), 1)
    return tuple(sorted({a % rank for a in axes} & set(range(x.dim()))))


def _keep_or_squeeze(y: torch.Tensor, dims: tuple[int, ...], keepdims) -> torch.Tensor:
    """`y` was reduced with keepdim=True; drop the reduced dims unless keepdims."""
    return y if keepdims or not dims else y.squeeze(dims)


def _computable(x: torch.Tensor) -> torch.Tensor:
    """Half floats accumulate in fp32 and integers in int64: at least the input's precision."""
    if x.dtype in _HALF:
        return x.float()
    if not x.dtype.is_floating_point and x.dtype != torch.bool:
        return x.to(torch.int64)
    return x


def _sum(x, dims):
    return torch.sum(x, dim=dims, keepdim=True)


def _prod(x, dims):
    for d in dims:
        x = torch.prod(x, dim=d, keepdim=True)
    return x


def _mean(x, dims):
    n = math.prod(x.shape[d] for d in dims)
    if x.dtype.is_floating_point:
        return torch.sum(x, dim=dims, keepdim=True) / n
    return torch.div(torch.sum(x, dim=dims, keepdim=True), n, rounding_mode="trunc")


def _log_sum_exp(x, dims):
    return torch.logsumexp(x, dim=dims, keepdim=True)


# kind -> (elementwise map before the reduction, reduction over keepdim dims, map after)
_REDUCTIONS = {
    "ReduceSum": (None, _sum, None),
    "ReduceSumSquare": (torch.square, _sum, None),
    "ReduceL1": (torch.abs, _sum, None),
    "ReduceL2": (torch.square, _sum, torch.sqrt),
    "ReduceLogSum": (None, _sum, torch.log),
    "ReduceLogSumExp": (None, _log_sum_exp, None),
    "ReduceMean": (None, _mean, None),
    "ReduceProd": (None, _prod, None),
}
_FLOAT_MATH = {"ReduceL2", "ReduceLogSum", "ReduceLogSumExp"}  # integer inputs go through float64


def _reduction(name: str):
    """The reference of a sum-like Reduce kind, built from its row of `_REDUCTIONS`."""
    pre, red, post = _REDUCTIONS[name]

    def ref(inputs, attrs):
        x = inputs[0]
        dims = reduce_dims(x, inputs, attrs)
        y = _computable(x)
        if name in _FLOAT_MATH and not y.dtype.is_floating_point:
            y = y.double()
        if pre is not None:
            y = pre(y)
        if dims:
            y = red(y, dims)
        if post is not None:
            y = post(y)
        return _keep_or_squeeze(y, dims, attrs.get("keepdims", 1)).to(x.dtype)

    return ref


for _name in _REDUCTIONS:
    kind(_name, attrs={"axes": INTS | NONE, "keepdims": INT, "noop_with_empty_axes": INT})(_reduction(_name))


def _orderable(x: torch.Tensor) -> torch.Tensor:
    """`x` mapped, order-preserving, to a dtype torch can compare (uint64 through a sign-bit flip)."""
    if x.dtype == torch.uint64:
        return x.view(torch.int64) ^ _SIGN
    return x.to(torch.int64) if x.dtype in _WIDE_UINT else x


def _from_orderable(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (y ^ _SIGN).view(torch.uint64) if dtype == torch.uint64 else y.to(dtype)


def _extreme(largest: bool):
    """ReduceMax / ReduceMin: an empty reduction gives the type's lowest / highest value."""

    def ref(inputs, attrs):
        x = inputs[0]
        dims = reduce_dims(x, inputs, attrs)
        if not dims:
            return x.clone()
        if any(x.shape[d] == 0 for d in dims):
            shape = [1 if d in dims else n for d, n in enumerate(x.shape)]
            y = torch.full(shape, _identity(x.dtype, largest), dtype=x.dtype, device=x.device)
        else:
            fn = torch.amax if largest else torch.amin
            y = _from_orderable(fn(_orderable(x), dim=dims, keepdim=True), x.dtype)
        return _keep_or_squeeze(y, dims, attrs.get("keepdims", 1))

    return ref


def _identity(dtype: torch.dtype, largest: bool):
    """The value a max (min) over no elements yields: the lowest (highest) value of the type."""
    if dtype == torch.bool:
        return not largest
    if dtype.is_floating_point:
        return -float("inf") if largest else float("inf")
    info = torch.iinfo(dtype)
    return info.min if largest else info.max


kind("ReduceMax", attrs={"axes": INTS | NONE, "keepdims": INT, "noop_with_empty_axes": INT})(_extreme(True))
kind("ReduceMin", attrs={"axes": INTS | NONE, "keepdims": INT, "noop_with_empty_axes": INT})(_extreme(False))


def _arg(largest: bool):
    """ArgMax / ArgMin: the first index of the extreme, or the last with select_last_index."""

    def ref(inputs, attrs):
        x = _orderable(inputs[0])
        axis = attrs.get("axis", 0) % max(x.dim(), 1)
        fn = torch.argmax if largest else torch.argmin
        if attrs.get("select_last_index"):
            idx = x.shape[axis] - 1 - fn(x.flip(axis), dim=axis, keepdim=True)
        else:
            idx = fn(x, dim=axis, keepdim=True)
        return idx if attrs.get("keepdims", 1) else idx.squeeze(axis)

    return ref


kind("ArgMax", attrs={"axis": INT, "keepdims": INT, "select_last_index": INT})(_arg(True))
kind("ArgMin", attrs={"axis": INT, "keepdims": INT, "select_last_index": INT})(_arg(False))
