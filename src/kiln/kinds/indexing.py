"""Reference implementations of the gather, scatter, selection and scan layer kinds.

Index inputs may be int32 or int64 and negative (counting from the end of their axis).
"""

from __future__ import annotations

import math

import torch

from kiln.kinds.registry import INT, STR, kind
from kiln.kinds.shape import axis_of, ints

_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def wrap(index: torch.Tensor, size) -> torch.Tensor:
    """Negative indices counted from the end, as int64."""
    index = index.long()
    return torch.where(index < 0, index + size, index)


@kind("Gather", attrs={"axis": INT})
def gather(inputs, attrs):
    x, idx = inputs
    axis = axis_of(attrs.get("axis", 0), x.dim())
    out = x.index_select(axis, wrap(idx, x.shape[axis]).reshape(-1))
    return out.reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1:])


@kind("GatherElements", attrs={"axis": INT})
def gather_elements(inputs, attrs):
    x, idx = inputs
    axis = axis_of(attrs.get("axis", 0), x.dim())
    return torch.gather(x, axis, wrap(idx, x.shape[axis]))


def _nd_rows(x: torch.Tensor, idx: torch.Tensor, batch_dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GatherND/ScatterND addressing: x as (batch, rows, *tail) and idx as (batch, n) row numbers.
    Sizes and strides stay Python ints: a host list made into a device tensor is a copy a CUDA graph cannot hold."""
    k = idx.shape[-1]
    lead = x.shape[batch_dims:batch_dims + k]
    rows = sum((wrap(idx[..., i], lead[i]) * math.prod(lead[i + 1:]) for i in range(k)),
               torch.zeros(idx.shape[:-1], dtype=torch.long, device=idx.device))
    batch = math.prod(x.shape[:batch_dims])
    return x.reshape(batch, math.prod(lead), *x.shape[batch_dims + k:]), rows.reshape(batch, -1)


@kind("GatherND", attrs={"batch_dims": INT})
def gather_nd(inputs, attrs):
    x, idx = inputs
    b = attrs.get("batch_dims", 0)
    table, rows = _nd_rows(x, idx, b)
    out = table[torch.arange(table.shape[0], device=x.device)[:, None], rows]
    return out.reshape(idx.shape[:-1] + x.shape[b + idx.shape[-1]:])


def _scatter(out: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduction: str) -> torch.Tensor:
    """out with src written (or combined by `reduction`) at `index` along dim; out is modified."""
    if reduction == "none":
        return out.scatter_(dim, index, src)
    return out.scatter_reduce_(dim, index, src, _REDUCE[reduction])


@kind("ScatterElements", attrs={"axis": INT, "reduction": STR})
def scatter_elements(inputs, attrs):
    x, idx, updates = inputs
    axis = axis_of(attrs.get("axis", 0), x.dim())
    return _scatter(x.clone(), axis, wrap(idx, x.shape[axis]), updates, attrs.get("reduction", "none"))


@kind("ScatterND", attrs={"reduction": STR})
def scatter_nd(inputs, attrs):
    x, idx, updates = inputs
    table, rows = _nd_rows(x.clone(), idx, 0)
    table, rows = table[0], rows[0]
    src = updates.reshape(-1, *table.shape[1:])
    index = rows.reshape(-1, *[1] * (table.dim() - 1)).expand_as(src)
    return _scatter(table, 0, index, src, attrs.get("reduction", "none")).reshape(x.shape)


@kind("OneHot", attrs={"axis": INT})
def one_hot(inputs, attrs):
    """values[1] where the (wrapped) index equals the position on the new axis, values[0] elsewhere."""
    idx, depth, values = inputs
    depth = int(depth.reshape(-1)[0].item())
    axis = axis_of(attrs.get("axis", -1), idx.dim() + 1)
    idx = idx.long() if not idx.dtype.is_floating_point else idx.trunc().long()
    idx = wrap(idx, depth).unsqueeze(axis)
    shape = [1] * (idx.dim())
    shape[axis] = depth
    hot = idx == torch.arange(depth, device=idx.device).reshape(shape)
    return torch.where(hot, values[1], values[0])


@kind("Compress", attrs={"axis": INT})
def compress(inputs, attrs):
    x, cond = inputs
    axis = attrs.get("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = axis_of(axis, x.dim())
    keep = torch.nonzero(cond.reshape(-1)[:x.shape[axis]].bool()).reshape(-1)
    return x.index_select(axis, keep)


@kind("NonZero", attrs={})
def non_zero(inputs, attrs):
    x = inputs[0]
    return torch.nonzero(x.reshape(1) if x.dim() == 0 else x).T.contiguous()


@kind("TopK", attrs={"axis": INT, "k": INT, "largest": INT, "sorted": INT})
def top_k(inputs, attrs):
    """The k largest (or smallest) along axis; equal values keep their input order, as ONNX requires."""
    x, k = inputs[0], ints(inputs[1])[0]
    if x.is_cuda and x.dtype in (torch.uint16, torch.uint32, torch.uint64):  # CUDA cannot sort these
        return tuple(t.to(x.device) for t in top_k([x.cpu(), inputs[1]], attrs))
    axis = axis_of(attrs.get("axis", -1), x.dim())
    values, order = torch.sort(x, dim=axis, descending=bool(attrs.get("largest", 1)), stable=True)
    return values.narrow(axis, 0, k), order.narrow(axis, 0, k)


@kind("Unique", attrs={"axis": INT, "sorted": INT})
def unique(inputs, attrs):
    """Unique values (or slices along axis), their first indices, the inverse map and the counts."""
    x, axis = inputs[0], attrs.get("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = axis_of(axis, x.dim())
    y, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=axis)
    positions = torch.arange(inverse.numel(), device=x.device)
    first = torch.full((counts.numel(),), inverse.numel(), dtype=torch.long, device=x.device)
    first = first.scatter_reduce(0, inverse, positions, "amin")
    if not attrs.get("sorted", 1):
        order = torch.argsort(first)
        rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=x.device))
        y, first, counts, inverse = y.index_select(axis, order), first[order], counts[order], rank[inverse]
    return y, first, inverse, counts


def _scan(op, inputs, attrs, identity: int):
    """CumSum/CumProd with ONNX's `exclusive` (shift in the identity) and `reverse` flags."""
    x, axis = inputs[0], axis_of(int(inputs[1].item()), inputs[0].dim())
    if attrs.get("reverse", 0):
        x = x.flip(axis)
    if attrs.get("exclusive", 0) and x.shape[axis]:
        first = torch.full_like(x.narrow(axis, 0, 1), identity)
        x = torch.cat([first, x.narrow(axis, 0, x.shape[axis] - 1)], dim=axis)
    out = op(x, dim=axis, dtype=x.dtype)
    return out.flip(axis) if attrs.get("reverse", 0) else out


@kind("CumSum", attrs={"exclusive": INT, "reverse": INT})
def cum_sum(inputs, attrs):
    return _scan(torch.cumsum, inputs, attrs, 0)


@kind("CumProd", attrs={"exclusive": INT, "reverse": INT})
def cum_prod(inputs, attrs):
    return _scan(torch.cumprod, inputs, attrs, 1)


@kind("ReverseSequence", attrs={"batch_axis": INT, "time_axis": INT})
def reverse_sequence(inputs, attrs):
    """Reverse the first sequence_lens[b] steps along the time axis of each batch entry b."""
    x, lens = inputs
    t_axis, b_axis = attrs.get("time_axis", 0), attrs.get("batch_axis", 1)
    along = lambda v, axis: v.reshape([-1 if i == axis else 1 for i in range(x.dim())])  # noqa: E731
    t = along(torch.arange(x.shape[t_axis], device=x.device), t_axis)
    n = along(lens.long(), b_axis)
    return torch.gather(x, t_axis, torch.where(t < n, n - 1 - t, t).expand(x.shape))


@kind("TensorScatter", attrs={"axis": INT, "mode": STR})
def tensor_scatter(inputs, attrs):
    """Write `update` into a copy of the cache along axis from each batch entry's write index."""
    cache, update = inputs[0], inputs[1]
    starts = (inputs[2] if len(inputs) > 2 and inputs[2] is not None
              else torch.zeros(cache.shape[0], device=cache.device))
    axis = axis_of(attrs.get("axis", -2), cache.dim())
    steps = torch.arange(update.shape[axis], device=cache.device)
    pos = starts.long().reshape(-1, 1) + steps
    if attrs.get("mode", "linear") == "circular":
        pos = pos.remainder(cache.shape[axis])
    shape = [1] * cache.dim()
    shape[0], shape[axis] = cache.shape[0], update.shape[axis]
    return cache.clone().scatter_(axis, pos.reshape(shape).expand(update.shape), update)
