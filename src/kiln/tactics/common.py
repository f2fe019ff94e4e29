"""Helpers shared by tactics: float checks, TF32 and cuDNN-search scoping."""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch
import torch.nn.functional as F

from kiln.ir import DType
from kiln.kernels.out_buffer import take
from kiln.tactics.spec import LayerSpec, ValueSpec

FLOATS = ("float32", "float16", "bfloat16")

# True while kiln tunes or warms an engine: cuDNN may time its algorithms for a shape it has not met (tens of ms per
# conv). Elsewhere a new shape takes cuDNN's heuristic pick at once; shapes searched before keep their timed pick.
_CUDNN_SEARCH: ContextVar[bool] = ContextVar("kiln_cudnn_search", default=False)


def float_io(spec: LayerSpec) -> str | None:
    """None if every present input and output is an fp32/fp16/bf16 tensor of one dtype, else the reason."""
    dtypes = {v.dtype.value if v.dtype else None for v in (*spec.inputs, *spec.outputs) if v is not None}
    if len(dtypes) != 1 or next(iter(dtypes)) not in FLOATS:
        return f"needs one float dtype among fp32/fp16/bf16, got {sorted(map(str, dtypes))}"
    return None


def attention_output(spec: LayerSpec) -> tuple[ValueSpec, str | None]:
    """A FusedAttention's output as the float it computes (its own, or Q's dtype when the layer writes it quantized,
    quant/fold_quantize.py), and why a float kernel cannot write it (only int8 quantizing is supported)."""
    out = spec.outputs[0]
    if spec.attrs.get("q_scale") is None:
        return out, None
    if out.dtype is not DType.INT8:
        return out, f"a quantized attention output of {out.dtype} (int8 only)"
    return ValueSpec(spec.inputs[0].dtype, out.shape), None


def first(out: list | None):
    """The first output's buffer from a kernel's `out` list (None when the engine gives none)."""
    return out[0] if out else None


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
           gelu: bool = False) -> torch.Tensor:
    """F.linear(x, w, bias) (cuBLASLt, bias epilogue), written into `out`'s bytes when given (mm / addmm out=,
    the same cuBLAS path F.linear takes); a bias that is not one value per column takes F.linear's own memory.
    `gelu`: gelu(x @ wᵀ + bias) in the same call (cuBLASLt's GELU_BIAS epilogue: the tanh approximation; needs
    a [N] bias)."""
    if not gelu and (out is None or (bias is not None and bias.dim() != 1) or x.dim() < 2):
        return F.linear(x, w, bias)
    x2 = x.reshape(-1, x.shape[-1])
    y = take(out, (x2.shape[0], w.shape[0]), x.dtype, x.device)
    if gelu:
        torch._addmm_activation(bias, x2, w.t(), use_gelu=True, out=y)
    elif bias is None:
        torch.mm(x2, w.t(), out=y)
    else:
        torch.addmm(bias, x2, w.t(), out=y)
    return y.view(*x.shape[:-1], w.shape[0])


def rank(v: ValueSpec | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


_MATMUL, _CUDNN = torch.backends.cuda.matmul, torch.backends.cudnn


@contextlib.contextmanager
def cudnn_search():
    """Within this scope (kiln's tuning and warm-up) cuDNN times its algorithms at each shape it meets first; the
    timed pick is kept for that shape (torch caches it by shape), so the run path never searches."""
    token = _CUDNN_SEARCH.set(True)
    try:
        yield
    finally:
        _CUDNN_SEARCH.reset(token)


class tf32:
    """Scope cuBLAS and cuDNN TF32 use to one kernel (fp32 layers compute in true fp32 unless --tf32), with cuDNN's
    algorithm search on only inside `cudnn_search()`. Entered around every eager layer call, so it touches only the
    flags that differ (a few µs, where torch's `cudnn.flags` took ~15)."""

    __slots__ = ("enabled", "changed")

    def __init__(self, enabled: bool):
        self.enabled, self.changed = enabled, ()

    def __enter__(self) -> None:
        e = self.enabled
        want = ((_MATMUL, "allow_tf32", e), (_CUDNN, "enabled", True), (_CUDNN, "benchmark", _CUDNN_SEARCH.get()),
                (_CUDNN, "deterministic", False), (_CUDNN, "allow_tf32", e))
        changed = []
        for owner, name, value in want:
            old = getattr(owner, name)
            if old != value:
                setattr(owner, name, value)
                changed.append((owner, name, old))
        self.changed = changed

    def __exit__(self, *exc) -> None:
        for owner, name, old in self.changed:
            setattr(owner, name, old)


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
