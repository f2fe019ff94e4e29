"""QuantizeLinear to int8 with one constant per-tensor scale and no zero point (what --int8 inserts) through
the one-pass Triton kernel (kernels/quantize.py)."""

from __future__ import annotations

from kiln.ir import DType
from kiln.kernels import quantize
from kiln.kernels.common import dtype_reason
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)


def _scale(spec: LayerSpec) -> float:
    return float(spec.inputs[1].const.reshape(-1)[0])


def _supports(spec: LayerSpec, device) -> str | None:
    a = spec.attrs
    x, s = spec.inputs[0], spec.inputs[1]
    zp = spec.inputs[2] if len(spec.inputs) > 2 else None
    if a.get("output_dtype") is not DType.INT8 or a.get("block_size", 0):
        return "only per-tensor int8 output"
    if x is None or x.dtype not in FLOATS or s is None or s.const is None or s.const.numel() != 1 \
            or s.dtype is not DType.FLOAT32:
        return "needs a float input and one constant fp32 scale"
    if zp is not None and (zp.const is None or bool(zp.const.any())):
        return "a non-zero (or non-constant) zero point"
    if a.get("precision") not in (None, DType.FLOAT32):
        return "the division runs in fp32 only"
    return dtype_reason(x.dtype.torch, device)


def _configs(spec: LayerSpec, device, level: int):
    return quantize.CONFIGS[:1] if level <= 1 else list(quantize.CONFIGS)


def _compile(spec: LayerSpec, config, device):
    scale = _scale(spec)
    return lambda inputs: [quantize.quantize(inputs[0], scale, config)]


register(Tactic("triton_quantize", ("QuantizeLinear",), _compile, _supports, _configs, priority=20))
