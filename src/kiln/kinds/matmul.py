"""Reference implementations of the matrix-multiplication kinds (fp32 accumulate for half types).

Gemm: inputs (A, B, optional C); attrs alpha float, beta float, transA int, transB int (ONNX names).
MatMul: inputs (A, B), numpy matmul semantics (N-D broadcasting, 1-D operands). No attributes.
MatMulInteger: inputs (A, B, optional a_zero_point, optional b_zero_point) → int32. No attributes.
QLinearMatMul: inputs (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp). No attributes.
"""

from __future__ import annotations

import torch

from kiln.kinds.conv import compute_dtype, requantize
from kiln.kinds.registry import FLOAT, INT, kind

_UNSIGNED_WIDE = {torch.uint32: torch.int64, torch.uint64: torch.int64}


def wide_compute(fn, *tensors: torch.Tensor) -> torch.Tensor:
    """Run fn on the tensors in a dtype torch computes in (fp32 for half types, int64 for unsigned
    32/64-bit, whose wrap-around is the same modulo 2^64), and cast the result back. CUDA has no integer
    matmul kernels: integer operands on the GPU are computed on the CPU and moved back."""
    dtype = tensors[0].dtype
    if tensors[0].is_cuda and not (dtype.is_floating_point or dtype.is_complex):
        return wide_compute(fn, *(t.cpu() for t in tensors)).to(tensors[0].device)
    if dtype == torch.uint64:
        return fn(*(t.view(torch.int64) for t in tensors)).view(torch.uint64)
    wide = _UNSIGNED_WIDE.get(dtype, compute_dtype(dtype))
    return fn(*(t.to(wide) for t in tensors)).to(dtype)


@kind("MatMul", attrs={})
def matmul(inputs, attrs):
    return wide_compute(torch.matmul, inputs[0], inputs[1])


@kind("Gemm", attrs={"alpha": FLOAT.req, "beta": FLOAT.req, "broadcast": INT, "transA": INT.req, "transB": INT.req})
def gemm(inputs, attrs):
    """Y = alpha · A' · B' + beta · C, C broadcast to (M, N)."""
    a, b, c = (inputs + [None] * 3)[:3]

    def fn(a, b, c=None):
        y = (a.T if attrs["transA"] else a) @ (b.T if attrs["transB"] else b)
        y = y * attrs["alpha"] if attrs["alpha"] != 1 else y
        return y if c is None else y + (c * attrs["beta"] if attrs["beta"] != 1 else c)

    return wide_compute(fn, *([a, b] if c is None else [a, b, c]))


def _zero_shift(x: torch.Tensor, zp: torch.Tensor | None, axis: int) -> torch.Tensor:
    """x - zp in float64 (exact for 8/16-bit integers); a 1-D zp runs along `axis` of x."""
    x = x.double()
    if zp is None:
        return x
    zp = zp.double()
    return x - (zp.reshape(-1, 1) if zp.dim() == 1 and axis == -2 else zp)


def _int_matmul(a, b, a_zp, b_zp) -> torch.Tensor:
    """(a - a_zp) @ (b - b_zp), exact in float64; a 1-D a_zp is per row of a, a 1-D b_zp per column of b."""
    return torch.matmul(_zero_shift(a, a_zp, -2), _zero_shift(b, b_zp, -1))


@kind("MatMulInteger", attrs={})
def matmul_integer(inputs, attrs):
    a, b, a_zp, b_zp = (inputs + [None] * 4)[:4]
    return _int_matmul(a, b, a_zp, b_zp).to(torch.int32)


@kind("QLinearMatMul", attrs={})
def qlinear_matmul(inputs, attrs):
    """round_half_even((a - a_zp) @ (b - b_zp) · a_scale·b_scale/y_scale) + y_zp, saturated.

    The scale ratio is formed in the scales' own dtype, as the ONNX reference does.
    """
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (inputs + [None] * 8)[:8]
    acc = _int_matmul(a, b, a_zp, b_zp)
    if a_scale.dim() == 1:
        a_scale = a_scale.reshape(-1, 1)
    return requantize(acc, a_scale * b_scale / y_scale, y_zp, a.dtype if y_zp is None else y_zp.dtype)
