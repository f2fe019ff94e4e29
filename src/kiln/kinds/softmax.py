"""Reference implementations of Softmax, LogSoftmax and Hardmax.

Attributes: `axis`, and `flatten` for ONNX before opset 13, where the input is coerced to 2-D at
`axis` so the normalization runs jointly over all dims from `axis` on.
"""

from __future__ import annotations

import torch

from kiln.kinds.registry import INT, kind

_HALF = (torch.float16, torch.bfloat16)


def _over_axis(fn):
    """Apply `fn(x, dim)` along `axis`, or along the flattened trailing dims when `flatten`."""

    def ref(inputs, attrs):
        x = inputs[0]
        axis = attrs.get("axis", -1) % max(x.dim(), 1)
        if not attrs.get("flatten"):
            return fn(x, axis)
        return fn(x.reshape(*x.shape[:axis], -1), axis).reshape(x.shape)

    return ref


def _softmax(x, dim):
    return torch.softmax(x, dim, dtype=torch.float32 if x.dtype in _HALF else None).to(x.dtype)


def _log_softmax(x, dim):
    return torch.log_softmax(x, dim, dtype=torch.float32 if x.dtype in _HALF else None).to(x.dtype)


def _hardmax(x, dim):
    """1 at the first maximum along `dim`, 0 elsewhere."""
    index = torch.argmax(x, dim=dim, keepdim=True)
    return torch.zeros_like(x).scatter_(dim, index, 1)


kind("Softmax", attrs={"axis": INT, "flatten": INT})(_over_axis(_softmax))
kind("LogSoftmax", attrs={"axis": INT, "flatten": INT})(_over_axis(_log_softmax))
kind("Hardmax", attrs={"axis": INT, "flatten": INT})(_over_axis(_hardmax))
