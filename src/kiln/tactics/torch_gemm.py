"""MatMul and Gemm through cuBLAS / cuBLASLt (torch), native dtype with fp32 accumulation.

A constant 2-D right operand is pre-transposed once so that F.linear (cuBLASLt, bias epilogue) runs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.kernels.out_buffer import take
from kiln.tactics.common import first, float_io, linear, rank, tf32
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec


def _supports_matmul(spec: LayerSpec, device) -> str | None:
    if rank(spec.inputs[0]) in (None, 0) or rank(spec.inputs[1]) in (None, 0):
        return "operand ranks unknown or scalar"
    return float_io(spec)


def _compile_matmul(spec: LayerSpec, config, device):
    b = spec.inputs[1].const
    allow = spec.tf32
    if b is not None and b.dim() == 2 and rank(spec.inputs[0]) >= 2:
        w = b.t().contiguous()  # [N, K] for F.linear

        def run(inputs, out=None):
            with tf32(allow):
                return [linear(inputs[0], w, None, first(out))]
        return run

    def run_general(inputs, out=None):
        a, b = inputs[:2]
        with tf32(allow):
            if not out or out[0] is None or a.dim() < 2 or b.dim() < 2:
                return [torch.matmul(a, b)]
            shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
            return [torch.matmul(a, b, out=take(out[0], shape, a.dtype, a.device))]
    return run_general


def _supports_gemm(spec: LayerSpec, device) -> str | None:
    if spec.inputs[1] is None or spec.inputs[1].const is None:
        return "B is not a build-time constant"
    return float_io(spec)


def _compile_gemm(spec: LayerSpec, config, device):
    a = spec.attrs
    b = spec.inputs[1].const
    w = (b if a["transB"] else b.t()).contiguous() * a["alpha"]  # [N, K], alpha folded in
    c = spec.inputs[2].const if len(spec.inputs) > 2 and spec.inputs[2] is not None else None
    if c is not None:
        c = c * a["beta"]
    has_c_input = len(spec.inputs) > 2 and spec.inputs[2] is not None and c is None
    trans_a, beta, allow = a["transA"], a["beta"], spec.tf32

    def run(inputs, out=None):
        x = inputs[0].t() if trans_a else inputs[0]
        with tf32(allow):
            if c is None and not has_c_input:
                return [linear(x, w, None, first(out))]
            if c is not None and c.dim() <= 1:
                return [linear(x, w, c.expand(w.shape[0]) if c.dim() == 0 or c.numel() == 1 else c, first(out))]
            y = F.linear(x, w)
        bias = c if c is not None else (inputs[2] * beta if has_c_input else None)
        return [y if bias is None else y + bias]

    return run


register(Tactic("cublas_matmul", ("MatMul",), _compile_matmul, _supports_matmul, priority=10, writes_out=True))
register(Tactic("cublas_gemm", ("Gemm",), _compile_gemm, _supports_gemm, priority=10, writes_out=True))
