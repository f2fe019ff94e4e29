"""Single activation layers (Relu, Sigmoid, Tanh, Gelu, ...) through the generated Triton pointwise kernel."""

from __future__ import annotations

from kiln.kernels import pointwise
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import io_reason


def _supports(spec: LayerSpec, device) -> str | None:
    return io_reason(spec, [spec.inputs[0], spec.outputs[0]], device)


def _configs(spec: LayerSpec, device, level: int):
    return pointwise.CONFIGS[:1] if level <= 1 else list(pointwise.CONFIGS)


def _compile(spec: LayerSpec, config, device):
    act, alpha, beta = pointwise.resolve(spec.kind, spec.attrs)
    return lambda inputs, out=None: [pointwise.apply(inputs[0], act, alpha, beta, config, first(out))]


register(Tactic("triton_pointwise", tuple(pointwise.OPS), _compile, _supports, _configs, priority=20,
                writes_out=True))
