"""Reference implementations of the normalization kinds.

Statistics are computed in a dtype at least as wide as float32 and the input (the `stash_type`
of LayerNormalization, RMSNormalization and GroupNormalization, an ONNX element-type code), and the
result is cast back once at the end.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.ir.dtype import DType
from kiln.kinds.registry import BOOL, FLOAT, INT, INTS, kind


def compute_dtype(*tensors: torch.Tensor | None, stash_type: int = 1) -> torch.dtype:
    """The widest of the stash type (float32 by default) and the given tensors' float dtypes."""
    dtype = DType.from_onnx(stash_type).torch
    for t in tensors:
        if t is not None and t.dtype.is_floating_point:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _moments(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and population variance over `dims`, kept as size-1 dims."""
    mean = x.mean(dims, keepdim=True)
    return mean, (x - mean).square().mean(dims, keepdim=True)


def _per_channel(t: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A [C] parameter shaped to broadcast over an [N, C, D1, ...] input."""
    return t.to(dtype).reshape(-1, *[1] * (x.dim() - 2))


@kind("BatchNormalization", attrs={"consumed_inputs": INTS, "epsilon": FLOAT, "is_test": INT, "momentum": FLOAT,
                                   "spatial": INT, "training_mode": INT})
def batch_normalization(inputs, attrs):
    """Inference uses the given statistics; training_mode uses the batch's and also returns the
    running mean and variance updated with `momentum`."""
    x, scale, bias, mean, var = inputs
    eps = attrs.get("epsilon", 1e-5)
    ct = compute_dtype(x, scale, bias, mean, var)
    xc = x.to(ct)
    if not attrs.get("training_mode"):
        cur_mean, cur_var = _per_channel(mean, x, ct), _per_channel(var, x, ct)
    else:
        cur_mean, cur_var = _moments(xc, (0, *range(2, x.dim())))
    y = (xc - cur_mean) * torch.rsqrt(cur_var + eps) * _per_channel(scale, x, ct) + _per_channel(bias, x, ct)
    if not attrs.get("training_mode"):
        return y.to(x.dtype)
    m = attrs.get("momentum", 0.9)
    running_mean = mean.to(ct) * m + cur_mean.reshape(-1) * (1 - m)
    running_var = var.to(ct) * m + cur_var.reshape(-1) * (1 - m)
    return y.to(x.dtype), running_mean.to(mean.dtype), running_var.to(var.dtype)


@kind("LayerNormalization", attrs={"axis": INT, "epsilon": FLOAT, "stash_type": INT})
def layer_normalization(inputs, attrs):
    """Standardize over dims `axis`.. in the stash type, then scale and shift; returns Y, Mean, InvStdDev."""
    x, scale, bias = (list(inputs) + [None])[:3]
    stash = attrs.get("stash_type", 1)
    ct = compute_dtype(x, stash_type=stash)
    xc = x.to(ct)
    mean, var = _moments(xc, tuple(range(attrs.get("axis", -1) % x.dim(), x.dim())))
    inv_std = torch.rsqrt(var + attrs.get("epsilon", 1e-5))
    y = (xc - mean) * inv_std * scale.to(ct)
    if bias is not None:
        y = y + bias.to(ct)
    out_dtype = DType.from_onnx(stash).torch
    return y.to(x.dtype), mean.to(out_dtype), inv_std.to(out_dtype)


@kind("RMSNormalization", attrs={"axis": INT, "epsilon": FLOAT, "stash_type": INT})
def rms_normalization(inputs, attrs):
    """x / sqrt(mean(x²) + ε) over dims `axis`.., times scale; the result has scale's dtype."""
    x, scale = inputs
    xc = x.to(compute_dtype(x, stash_type=attrs.get("stash_type", 1)))
    dims = tuple(range(attrs.get("axis", -1) % x.dim(), x.dim()))
    y = xc * torch.rsqrt(xc.square().mean(dims, keepdim=True) + attrs.get("epsilon", 1e-5))
    return (y * scale.to(y.dtype)).to(scale.dtype)


@kind("GroupNormalization", attrs={"epsilon": FLOAT, "group_affine": BOOL, "num_groups": INT.req, "stash_type": INT})
def group_normalization(inputs, attrs):
    """Standardize each group of channels per instance; scale/bias are per channel, or per group
    when `group_affine` (ONNX opset 18)."""
    x, scale, bias = inputs
    groups = attrs["num_groups"]
    ct = compute_dtype(x, stash_type=attrs.get("stash_type", 1))
    xg = x.to(ct).reshape(x.shape[0], groups, -1)
    mean, var = _moments(xg, (2,))
    norm = ((xg - mean) * torch.rsqrt(var + attrs.get("epsilon", 1e-5))).reshape(x.shape)
    if attrs.get("group_affine"):
        per_group = x.shape[1] // groups
        scale, bias = scale.repeat_interleave(per_group), bias.repeat_interleave(per_group)
    return (norm * _per_channel(scale, x, ct) + _per_channel(bias, x, ct)).to(x.dtype)


@kind("InstanceNormalization", attrs={"consumed_inputs": INTS, "epsilon": FLOAT})
def instance_normalization(inputs, attrs):
    """Standardize each channel of each instance over its spatial dims, then scale and shift per channel."""
    x, scale, bias = inputs
    ct = compute_dtype(x, scale, bias)
    xc = x.to(ct)
    mean, var = _moments(xc, tuple(range(2, x.dim())))
    y = (xc - mean) * torch.rsqrt(var + attrs.get("epsilon", 1e-5))
    return (y * _per_channel(scale, x, ct) + _per_channel(bias, x, ct)).to(x.dtype)


@kind("LRN", attrs={"alpha": FLOAT, "beta": FLOAT, "bias": FLOAT, "size": INT.req})
def lrn(inputs, attrs):
    """x / (bias + alpha/size · Σ x²)^beta, the sum over channels c-⌊(size-1)/2⌋ .. c+⌈(size-1)/2⌉."""
    x = inputs[0]
    size = attrs["size"]
    xc = x.to(compute_dtype(x))
    front = (size - 1) // 2
    windows = F.pad(xc.square().movedim(1, -1), (front, size - 1 - front)).unfold(-1, size, 1)
    square_sum = windows.sum(-1).movedim(-1, 1)
    y = xc / (attrs.get("bias", 1.0) + attrs.get("alpha", 1e-4) / size * square_sum) ** attrs.get("beta", 0.75)
    return y.to(x.dtype)


@kind("LpNormalization", attrs={"axis": INT, "p": INT})
def lp_normalization(inputs, attrs):
    """x divided by its L1 or L2 norm along `axis`; 0 where that norm is 0."""
    x = inputs[0]
    xc = x.to(compute_dtype(x))
    axis = attrs.get("axis", -1)
    p = attrs.get("p", 2)
    norm = xc.abs().sum(axis, keepdim=True) if p == 1 else xc.square().sum(axis, keepdim=True).sqrt()
    return torch.where(norm == 0, 0, xc / norm).to(x.dtype)


@kind("MeanVarianceNormalization", attrs={"axes": INTS})
def mean_variance_normalization(inputs, attrs):
    """(x - E[x]) / (sqrt(Var[x]) + 1e-9) over `axes`, the 1e-9 as in ONNX's function body."""
    x = inputs[0]
    xc = x.to(compute_dtype(x))
    dims = tuple(sorted({a % x.dim() for a in attrs.get("axes", [0, 2, 3])}))
    mean, var = _moments(xc, dims)
    return ((xc - mean) / (var.sqrt() + 1e-9)).to(x.dtype)
