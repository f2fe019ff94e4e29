"""FusedGemm through cuBLASLt with an algorithm the autotuner picked among those cuBLASLt's heuristic offers
(kernels/cublaslt.py), where torch (cublaslt_fused_gemm) always runs the first: fp16 / bf16, a constant weight
and bias, no activation, ReLU or GELU (cuBLASLt's tanh approximation, as cublaslt_fused_gemm's GELU epilogue),
rows known when the engine is built. A layer run at other rows takes torch's cuBLAS call."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.ir import DType
from kiln.kernels import cublaslt
from kiln.kernels.out_buffer import take
from kiln.tactics.common import first, float_io, rowwise
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import rows

ACTIVATIONS = {"none": "none", "Relu": "relu", "Gelu": "gelu", "GeluTanh": "gelu"}


def _weight(spec: LayerSpec) -> torch.Tensor:
    """The weight as [K, N], contiguous."""
    w = spec.inputs[1].const
    return (w.t() if spec.attrs.get("trans_b") else w).contiguous()


def _bias(spec: LayerSpec) -> torch.Tensor | None:
    return spec.inputs[2].const.reshape(-1) if len(spec.inputs) > 2 and spec.inputs[2] is not None else None


def _supports(spec: LayerSpec, device) -> str | None:
    w = spec.inputs[1]
    if w is None or w.const is None or w.const.dim() != 2:
        return "weight is not a constant 2-D tensor"
    n = w.const.shape[0 if spec.attrs.get("trans_b") else 1]
    bias = spec.inputs[2] if len(spec.inputs) > 2 else None
    if bias is not None and (bias.const is None or bias.const.numel() != n):
        return "bias is not a constant vector of one value per output column"
    if spec.attrs.get("activation", "none") not in ACTIVATIONS:
        return f"activation {spec.attrs.get('activation')!r} has no cuBLASLt epilogue here"
    if spec.inputs[0].dtype not in (DType.FLOAT16, DType.BFLOAT16):
        return "fp16 or bf16 only"
    if rows(spec.inputs[0]) is None:
        return "rows unknown when the engine is built (cuBLASLt's heuristic needs the shape)"
    return float_io(spec)


def _gemm(spec: LayerSpec, device, w: torch.Tensor) -> cublaslt.LtGemm:
    """The layer's cuBLASLt GEMM for weight `w` ([K, N])."""
    bias, dev = _bias(spec), torch.device(device.torch_device)
    return cublaslt.LtGemm(rows(spec.inputs[0]), w.shape[0], w.shape[1], spec.inputs[0].dtype.torch,
                           ACTIVATIONS[spec.attrs.get("activation", "none")],
                           None if bias is None else bias.to(dev, w.dtype), dev.index or 0)


def _configs(spec: LayerSpec, device, level: int):
    algos = _gemm(spec, device, _weight(spec)).heuristics()
    return [a.to_config() for a in (algos[:1] if level <= 1 else algos)]


def _compile(spec: LayerSpec, config, device):
    w = _weight(spec)
    gemm = _gemm(spec, device, w)
    algo = cublaslt.Algo.from_config(config)
    gemm.check(algo)
    struct = algo.struct()
    workspaces = cublaslt.Workspaces(algo.workspace)
    act = ACTIVATIONS[spec.attrs.get("activation", "none")]

    def other_rows(x2: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Rows other than those built for: torch's cuBLAS call, then the activation."""
        torch.mm(x2, w, out=y) if gemm.bias is None else torch.addmm(gemm.bias, x2, w, out=y)
        return y.relu_() if act == "relu" else y.copy_(F.gelu(y, approximate="tanh")) if act == "gelu" else y

    def gemm_rows(x: torch.Tensor, buf) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        y = take(buf, (x2.shape[0], gemm.n), x.dtype, x.device)
        if x2.shape[0] == gemm.m:
            gemm(x2, w, y, struct, workspaces.get(x.device))
        else:
            other_rows(x2, y)
        return y.view(*x.shape[:-1], gemm.n)

    def run(inputs, out=None):
        return [rowwise(lambda x: gemm_rows(x, first(out)), inputs[0])]

    return run


register(Tactic("cublaslt_algo_gemm", ("FusedGemm",), _compile, _supports, _configs, priority=15, writes_out=True,
                card_specific=True))
