"""Elementwise activations: y = act(x) over a contiguous tensor, computed in fp32, BLOCK values per program.

The op table maps each layer kind to a name of `common.activate` and the attributes it reads, so
that one kernel source serves every activation (each name compiles to its own specialization).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kiln.kernels.common import activate, pdl_args, pdl_start
from kiln.kernels.out_buffer import take

# kind -> (activation name or a function of the attrs giving it, (alpha attr, default), (beta attr, default))
OPS = {
    "Relu": ("relu", None, None),
    "LeakyRelu": ("leaky_relu", ("alpha", 0.01), None),
    "Sigmoid": ("sigmoid", None, None),
    "Tanh": ("tanh", None, None),
    "Gelu": (lambda a: "gelu_tanh" if a.get("approximate") == "tanh" else "gelu_erf", None, None),
    "Swish": ("silu", ("alpha", 1.0), None),
    "HardSigmoid": ("hard_sigmoid", ("alpha", 0.2), ("beta", 0.5)),
    "HardSwish": ("hard_swish", None, None),
    "Softsign": ("softsign", None, None),
    "Elu": ("elu", ("alpha", 1.0), None),
}
CONFIGS = [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 2048, "num_warps": 8}, {"BLOCK": 4096, "num_warps": 8},
           {"BLOCK": 512, "num_warps": 4}, {"BLOCK": 1024, "num_warps": 2}]


@triton.jit
def _pointwise_kernel(x, y, n, alpha, beta, ACT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    v = tl.load(x + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(y + offs, activate(v, ACT, alpha, beta).to(y.dtype.element_ty), mask=inside)


def resolve(kind: str, attrs: dict) -> tuple[str, float, float]:
    """(activation name, alpha, beta) of a layer of `kind` with `attrs`."""
    name, a, b = OPS[kind]
    return (name(attrs) if callable(name) else name, float(attrs.get(a[0], a[1])) if a else 0.0,
            float(attrs.get(b[0], b[1])) if b else 0.0)


def apply(x: torch.Tensor, activation: str, alpha: float = 0.0, beta: float = 0.0,
          config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """act(x) elementwise in x's dtype, in `out`'s bytes when given."""
    cfg = config or CONFIGS[0]
    src = x.contiguous()
    y = take(out, x.shape, x.dtype, x.device)
    n = src.numel()
    if n:
        _pointwise_kernel[(triton.cdiv(n, cfg["BLOCK"]),)](src, y, n, float(alpha), float(beta), ACT=activation,
                                                           BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"],
                                                           **pdl_args(x.device))
    return y


@triton.jit
def _bias_act_kernel(y, bias, r, n, C, inner, alpha, beta, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                     ACT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    v = tl.load(y + offs, mask=inside, other=0.0).to(tl.float32)
    if HAS_BIAS:
        v += tl.load(bias + (offs // inner) % C, mask=inside, other=0.0).to(tl.float32)
    if HAS_RES:
        v += tl.load(r + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(y + offs, activate(v, ACT, alpha, beta).to(y.dtype.element_ty), mask=inside)


def bias_act_(y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str,
              alpha: float = 0.0, beta: float = 0.0, config: dict | None = None) -> torch.Tensor:
    """y ← act(y + bias[channel] + residual) in place, in one pass: a conv's epilogue after a library conv that
    left it out (torch adds a conv's bias as a broadcast pass of its own, and the activation as another). y is 4-D,
    dense in NCHW or NHWC memory; the residual is read in y's layout."""
    cfg = config or CONFIGS[0]
    nhwc = y.dim() == 4 and not y.is_contiguous() and y.is_contiguous(memory_format=torch.channels_last)
    fmt = torch.channels_last if nhwc else torch.contiguous_format
    if not y.is_contiguous(memory_format=fmt):
        raise ValueError("bias_act_ needs y dense in NCHW or NHWC memory")
    c = y.shape[1]
    inner = 1 if nhwc else math.prod(y.shape[2:])
    r = residual.contiguous(memory_format=fmt) if residual is not None else y
    n = y.numel()
    if n:
        _bias_act_kernel[(triton.cdiv(n, cfg["BLOCK"]),)](
            y, bias if bias is not None else y, r, n, c, inner, float(alpha), float(beta), HAS_BIAS=bias is not None,
            HAS_RES=residual is not None, ACT=activation, BLOCK=cfg["BLOCK"], num_warps=cfg["num_warps"],
            **pdl_args(y.device))
    return y
