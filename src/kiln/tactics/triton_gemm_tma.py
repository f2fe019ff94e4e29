"""MatMul and FusedGemm in fp16 / bf16 through the TMA-fed Triton GEMM (kernels/gemm_tma.py), Hopper only: a
constant weight, bias and activation in the epilogue, plain and persistent tiles. On an H200 (2026-11-29,
gpu_gemm_tma_probe) it came within 2-6 % of cuBLASLt at BERT's and MiniLM's GEMMs, ahead only at MiniLM's QKV
(17.1 against 18.2 µs), and 30 % behind with the erf GELU epilogue (87.7 against 67.7 µs): cuBLASLt supersedes it
below the exhaustive opt level."""

from __future__ import annotations

from kiln.ir.dtype import DType
from kiln.kernels import gemm_tma
from kiln.kernels.common import smem_limit
from kiln.tactics.common import first, rowwise
from kiln.tactics.int8_common import tma_device_reason
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import act_kwargs, rows
from kiln.tactics.triton_gemm import supports_matmul

HALF = (DType.FLOAT16, DType.BFLOAT16)


def _nk(spec: LayerSpec) -> tuple[int, int]:
    """(N, K) of the layer's weight, stored [K, N] or, trans_b, [N, K]."""
    rows_, cols = spec.inputs[1].const.shape
    return (rows_, cols) if spec.attrs.get("trans_b") else (cols, rows_)


def _supports(spec: LayerSpec, device) -> str | None:
    """A constant [K, N] (or, trans_b, [N, K]) weight, fp16 / bf16, K and N multiples of 8, a TMA device."""
    reason = supports_matmul(spec, device)
    if reason:
        return reason
    if spec.outputs[0].dtype not in HALF:
        return "fp16 / bf16 only (TMA tiles of 2-byte values)"
    if not gemm_tma.addressable(*_nk(spec)):
        return "K and N must be multiples of 8 (TMA's 16-byte rows)"
    return tma_device_reason(device)


def _configs(spec: LayerSpec, device, level: int):
    n, k = _nk(spec)
    out = gemm_tma.configs(rows(spec.inputs[0]), n, k, smem_limit(device))
    return out if level >= 2 else out[:2]


def _compile(spec: LayerSpec, config, device):
    b = spec.inputs[1].const
    w = (b if spec.attrs.get("trans_b") else b.t()).contiguous()  # [N, K]: TMA's layout
    kw = act_kwargs(spec.attrs)

    def run(inputs, out=None):
        bias = inputs[2].reshape(-1) if len(inputs) > 2 and inputs[2] is not None else None
        return [rowwise(lambda a: gemm_tma.matmul(a.reshape(-1, a.shape[-1]), w, bias, config=config,
                                                  out=first(out), **kw).view(*a.shape[:-1], w.shape[0]), inputs[0])]

    return run


register(Tactic("triton_tma_gemm", ("MatMul", "FusedGemm"), _compile, _supports, _configs, priority=21,
                arch_specific=True, writes_out=True, superseded_by=("cublaslt_fused_gemm", "cublas_matmul")))
