"""QuantizeLinear to int8 or fp8 e4m3 with one constant per-tensor scale and no zero point (what --int8 / --fp8
insert) through the one-pass Triton kernel (kernels/quantize.py); fp8 on compute capability 8.9 and later."""

from __future__ import annotations

from kiln.ir import DType
from kiln.kernels import quantize
from kiln.kernels.common import dtype_reason
from kiln.tactics.int8_lowering import fp8_device_reason
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
OUTPUTS = (DType.INT8, DType.FP8E4M3)


def _scale(spec: LayerSpec) -> float:
    return float(spec.inputs[1].const.reshape(-1)[0])


def _supports(spec: LayerSpec, device) -> str | None:
    a = spec.attrs
    x, s = spec.inputs[0], spec.inputs[1]
    zp = spec.inputs[2] if len(spec.inputs) > 2 else None
    if a.get("output_dtype") not in OUTPUTS or a.get("block_size", 0):
        return "only per-tensor int8 or fp8 e4m3 output"
    if x is None or x.dtype not in FLOATS or s is None or s.const is None or s.const.numel() != 1 \
            or s.dtype is not DType.FLOAT32:
        return "needs a float input and one constant fp32 scale"
    if zp is not None and (zp.const is None or bool(zp.const.any())):
        return "a non-zero (or non-constant) zero point"
    if a["output_dtype"] is DType.FP8E4M3 and not a.get("saturate", True):
        return "fp8 without saturation (out-of-range values become NaN) runs on the reference"
    if a.get("precision") not in (None, DType.FLOAT32):
        return "the division runs in fp32 only"
    return dtype_reason(x.dtype.torch, device) or (fp8_device_reason(device) if a["output_dtype"] is DType.FP8E4M3
                                                   else None)


def _configs(spec: LayerSpec, device, level: int):
    return quantize.CONFIGS[:1] if level <= 1 else list(quantize.CONFIGS)


def _compile(spec: LayerSpec, config, device):
    scale, dtype = _scale(spec), spec.attrs["output_dtype"].torch
    return lambda inputs, out=None: [quantize.quantize(inputs[0], scale, config, dtype, first(out))]


register(Tactic("triton_quantize", ("QuantizeLinear",), _compile, _supports, _configs, priority=20, writes_out=True))
