"""LayerNormalization and Softmax through torch's fused native kernels, in the tensor's own dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.tactics.common import float_io, rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec


def _supports_ln(spec: LayerSpec, device) -> str | None:
    if any(o.dtype is not None for o in spec.outputs[1:]):
        return "Mean / InvStdDev outputs are requested"
    if rank(spec.inputs[0]) is None or spec.inputs[0].shape is None:
        return "input rank unknown"
    r = rank(spec.inputs[0])
    axis = spec.attrs.get("axis", -1) % r
    if not all(isinstance(d, int) for d in spec.inputs[0].shape[axis:]):
        return "normalized dims are not static"
    return float_io(spec)


def _compile_ln(spec: LayerSpec, config, device):
    x = spec.inputs[0]
    axis = spec.attrs.get("axis", -1) % len(x.shape)
    norm_shape = tuple(x.shape[axis:])
    eps = spec.attrs.get("epsilon", 1e-5)

    def run(inputs):
        scale = inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        return [F.layer_norm(inputs[0], norm_shape, scale, bias, eps)]

    return run


def _supports_softmax(spec: LayerSpec, device) -> str | None:
    if spec.attrs.get("flatten"):
        return "opset < 13 Softmax coerces the input to 2-D"
    return float_io(spec)


def _compile_softmax(spec: LayerSpec, config, device):
    axis = spec.attrs.get("axis", -1)
    return lambda inputs: [torch.softmax(inputs[0], axis)]


register(Tactic("torch_layernorm", ("LayerNormalization",), _compile_ln, _supports_ln, priority=10, fresh=True))
register(Tactic("torch_softmax", ("Softmax",), _compile_softmax, _supports_softmax, priority=10, fresh=True))
