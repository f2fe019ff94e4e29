"""MatMul, Gemm and FusedGemm through the generated Triton GEMM (kernels/gemm.py): constant right
operand, alpha/beta/bias/activation fused into the epilogue, tile configs pruned by shared memory; split-K
configs where the tiles underfill the GPU, each compiled kernel with its own scratch."""

from __future__ import annotations

import torch

from kiln.kernels import gemm
from kiln.kernels.common import SplitScratch, sm_count, smem_limit
from kiln.tactics.common import first, rank, rowwise
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import FUSED_ACTS, epilogue, io_reason, rows

def _configs(spec: LayerSpec, m: int | None, device, level: int):
    k, n = spec.inputs[1].const.shape[-2:]
    if spec.attrs.get("transB") or spec.attrs.get("trans_b"):
        k, n = n, k
    return gemm.configs(m, n, k, spec.outputs[0].dtype.torch.itemsize, smem_limit(device), level,
                        sm_count(torch.device(device.torch_device)))


def supports_matmul(spec: LayerSpec, device) -> str | None:
    """MatMul and FusedGemm: a constant 2-D right operand, an N-D left operand, an optional 1-D bias."""
    w = spec.inputs[1]
    if w is None or w.const is None or w.const.dim() != 2:
        return "right operand is not a constant 2-D matrix"
    if rank(spec.inputs[0]) in (None, 0):
        return "left operand rank unknown or scalar"
    if spec.attrs.get("activation", "none") not in FUSED_ACTS:
        return f"activation {spec.attrs['activation']!r} has no Triton epilogue"
    bias = spec.inputs[2] if len(spec.inputs) > 2 else None
    if bias is not None and rank(bias) != 1:
        return "bias is not 1-D"
    return io_reason(spec, [*spec.inputs, spec.outputs[0]], device)


def _configs_matmul(spec: LayerSpec, device, level: int):
    return _configs(spec, rows(spec.inputs[0]), device, level)


def _compile_matmul(spec: LayerSpec, config, device):
    """MatMul, or FusedGemm (`trans_b`, bias, activation): rows of the N-D left operand times W."""
    b = spec.inputs[1].const
    w = (b.t() if spec.attrs.get("trans_b") else b).contiguous()
    act, act_alpha, act_beta = epilogue(spec.attrs)
    tf32, scratch = spec.tf32, SplitScratch()

    def rows(a, bias, buf):
        y = gemm.matmul(a.reshape(-1, a.shape[-1]), w, bias, activation=act, act_alpha=act_alpha,
                        act_beta=act_beta, config=config, tf32=tf32, out=buf, scratch=scratch)
        return y.reshape(*a.shape[:-1], w.shape[1])

    def run(inputs, out=None):
        bias = inputs[2] if len(inputs) > 2 else None
        return [rowwise(lambda a: rows(a, bias, first(out)), inputs[0])]

    return run


def _supports_gemm(spec: LayerSpec, device) -> str | None:
    b = spec.inputs[1]
    if b is None or b.const is None:
        return "B is not a build-time constant"
    if rank(spec.inputs[0]) != 2 or b.const.dim() != 2:
        return "A and B must be 2-D"
    return io_reason(spec, [*spec.inputs, spec.outputs[0]], device)


def _configs_gemm(spec: LayerSpec, device, level: int):
    m = spec.inputs[0].shape[1 if spec.attrs.get("transA") else 0]
    return _configs(spec, m if isinstance(m, int) else None, device, level)


def _compile_gemm(spec: LayerSpec, config, device):
    a = spec.attrs
    b = spec.inputs[1].const
    w = (b.t() if a["transB"] else b).contiguous()
    trans_a, alpha, beta, tf32, scratch = a["transA"], a["alpha"], a["beta"], spec.tf32, SplitScratch()

    def run(inputs, out=None):
        x = inputs[0].t() if trans_a else inputs[0]
        c = inputs[2] if len(inputs) > 2 else None
        return [gemm.matmul(x, w, c, alpha=alpha, beta=beta, config=config, tf32=tf32, out=first(out),
                            scratch=scratch)]

    return run


register(Tactic("triton_matmul", ("MatMul",), _compile_matmul, supports_matmul, _configs_matmul, priority=20,
                writes_out=True))
register(Tactic("triton_fused_gemm", ("FusedGemm",), _compile_matmul, supports_matmul, _configs_matmul,
                priority=20, writes_out=True))
register(Tactic("triton_gemm", ("Gemm",), _compile_gemm, _supports_gemm, _configs_gemm, priority=20,
                writes_out=True))
