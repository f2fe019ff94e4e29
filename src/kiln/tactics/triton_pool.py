"""2-D MaxPool through the Triton kernel (kernels/pool.py): float, and the int8 / fp8 activations of quantized
engines (torch has no integer max pooling on CUDA); timed against torch_pool on float inputs. Global average and
max pooling of float 2-D maps too, its configs timed on the layout each was made for: torch's mean over an NCHW
map's H and W is a slow strided reduction."""

from __future__ import annotations

from kiln.ir import DType
from kiln.kernels import pool
from kiln.kernels.common import dtype_reason
from kiln.tactics.common import first, rank
from kiln.tactics.int8_lowering import fp8_device_reason
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

DTYPES = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.INT8, DType.FP8E4M3)


def _supports(spec: LayerSpec, device) -> str | None:
    a, x, y = spec.attrs, spec.inputs[0], spec.outputs[0]
    if rank(x) != 4 or rank(y) != 4 or not all(isinstance(d, int) for d in (*x.shape[1:], *y.shape[2:])):
        return "2-D pooling with static channels and spatial size only"
    if a.get("auto_pad", "NOTSET") != "NOTSET":
        return "pads are not explicit"
    if len(spec.outputs) > 1 and spec.outputs[1].dtype is not None:
        return "MaxPool Indices output is requested"
    spans = [(k - 1) * d + 1 for k, d in zip(a["kernel_shape"], a.get("dilations", [1, 1]))]
    if any(p >= s for p, s in zip(a["pads"], spans * 2)):
        return "a window could lie wholly in the padding"
    if x.dtype not in DTYPES or y.dtype is not x.dtype:
        return f"needs one dtype among {[d.value for d in DTYPES]}"
    if x.dtype is DType.FP8E4M3:
        return fp8_device_reason(device)
    return dtype_reason(x.dtype.torch, device)


def _configs(spec: LayerSpec, device, level: int):
    return pool.CONFIGS[:1] if level <= 1 else list(pool.CONFIGS)


def _compile(spec: LayerSpec, config, device):
    a = spec.attrs
    kernel, strides, pads = tuple(a["kernel_shape"]), tuple(a["strides"]), tuple(a["pads"][:2])
    dilations, out_hw = tuple(a.get("dilations", [1, 1])), tuple(spec.outputs[0].shape[2:])
    return lambda inputs, out=None: [pool.max_pool2d(inputs[0], kernel, strides, pads, dilations, out_hw, config,
                                                     first(out))]


register(Tactic("triton_pool", ("MaxPool",), _compile, _supports, _configs, priority=12, writes_out=True))


def _supports_global(spec: LayerSpec, device) -> str | None:
    x = spec.inputs[0]
    if rank(x) != 4:
        return "2-D maps only"
    if x.dtype not in DTYPES[:3] or spec.outputs[0].dtype is not x.dtype:
        return "float maps only"
    return dtype_reason(x.dtype.torch, device)


def _compile_global(spec: LayerSpec, config, device):
    op = "max" if spec.kind == "GlobalMaxPool" else "avg"
    return lambda inputs, out=None: [pool.global_pool2d(inputs[0], op, config, first(out))]


register(Tactic("triton_global_pool", ("GlobalAveragePool", "GlobalMaxPool"), _compile_global, _supports_global,
                lambda spec, device, level: list(pool.GLOBAL_CONFIGS[:1] if level <= 1 else pool.GLOBAL_CONFIGS),
                priority=12, writes_out=True))
