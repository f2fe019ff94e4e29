"""LayerNormalization and Softmax over the last dim through the generated Triton row kernels."""

from __future__ import annotations

import math

from kiln.kernels import layernorm, softmax
from kiln.kernels.common import row_configs
from kiln.tactics.common import rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import io_reason


def _width(spec: LayerSpec) -> int:
    n = spec.inputs[0].shape[-1] if spec.inputs[0].shape else None
    return n if isinstance(n, int) else 1024


def _configs(spec: LayerSpec, device, level: int):
    return row_configs(_width(spec), level)


def _supports_ln(spec: LayerSpec, device) -> str | None:
    x = spec.inputs[0]
    if any(o.dtype is not None for o in spec.outputs[1:]):
        return "Mean / InvStdDev outputs are requested"
    r = rank(x)
    if not r:
        return "input rank unknown or scalar"
    if spec.attrs.get("axis", -1) % r != r - 1:
        return "normalizes over more than the last dim"
    n = x.shape[-1]
    if not isinstance(n, int):
        return "last dim is not static"
    for p in spec.inputs[1:3]:
        if p is not None and (not p.static or not p.shape or p.shape[-1] != n or math.prod(p.shape) != n):
            return "scale / bias do not hold exactly the last dim's values"
    if spec.attrs.get("stash_type", 1) != 1:
        return "stash_type other than float32"
    return io_reason(spec, [*spec.inputs[:3], spec.outputs[0]], device)


def _compile_ln(spec: LayerSpec, config, device):
    eps = spec.attrs.get("epsilon", 1e-5)

    def run(inputs):
        return [layernorm.layer_norm(inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None, eps, config)]

    return run


def _supports_softmax(spec: LayerSpec, device) -> str | None:
    if spec.attrs.get("flatten"):
        return "opset < 13 Softmax coerces the input to 2-D"
    r = rank(spec.inputs[0])
    if not r:
        return "input rank unknown or scalar"
    if spec.attrs.get("axis", -1) not in (-1, r - 1):
        return "softmax over a dim other than the last"
    return io_reason(spec, [spec.inputs[0], spec.outputs[0]], device)


def _compile_softmax(spec: LayerSpec, config, device):
    return lambda inputs: [softmax.softmax(inputs[0], config)]


register(Tactic("triton_layernorm", ("LayerNormalization",), _compile_ln, _supports_ln, _configs, priority=20))
register(Tactic("triton_softmax", ("Softmax",), _compile_softmax, _supports_softmax, _configs, priority=20))
