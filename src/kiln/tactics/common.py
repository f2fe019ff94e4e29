"""Helpers shared by tactics: float checks, TF32 scoping."""

from __future__ import annotations

import contextlib

import torch

from kiln.tactics.spec import LayerSpec, ValueSpec

FLOATS = ("float32", "float16", "bfloat16")


def float_io(spec: LayerSpec) -> str | None:
    """None if every present input and output is an fp32/fp16/bf16 tensor of one dtype, else the reason."""
    dtypes = {v.dtype.value if v.dtype else None for v in (*spec.inputs, *spec.outputs) if v is not None}
    if len(dtypes) != 1 or next(iter(dtypes)) not in FLOATS:
        return f"needs one float dtype among fp32/fp16/bf16, got {sorted(map(str, dtypes))}"
    return None


def rank(v: ValueSpec | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


@contextlib.contextmanager
def tf32(enabled: bool):
    """Scope cuBLAS and cuDNN TF32 use to one kernel (fp32 layers compute in true fp32 unless --tf32).

    cuDNN's own algorithm search (benchmark mode) stays on: it runs once per shape, during tuning.
    """
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False, allow_tf32=enabled):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def rowwise(fn, x: torch.Tensor) -> torch.Tensor:
    """fn (a map of the rows over the last dim, like a linear layer) applied to `x`; when `x` is a view whose
    leading dims are permuted (as a Transpose view leaves them), fn runs on the rows in memory order and
    the result is permuted back the same way, so no copy is made."""
    if x.dim() <= 2 or x.is_contiguous() or x.stride(-1) != 1:
        return fn(x)
    lead = sorted(range(x.dim() - 1), key=lambda d: -x.stride(d))
    dense = x.permute(*lead, x.dim() - 1)
    if not dense.is_contiguous():
        return fn(x)
    back = sorted(range(x.dim()), key=lambda d: ([*lead, x.dim() - 1]).index(d))
    return fn(dense).permute(back)
