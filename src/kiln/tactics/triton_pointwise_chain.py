"""A PointwiseChain as one generated Triton kernel (kernels/pointwise_chain.py), where its reference runs a torch
kernel per step: inputs of the output's shape or that broadcast to it, steps the generated source knows."""

from __future__ import annotations

import torch

from kiln.kernels import pointwise, pointwise_chain
from kiln.tactics.common import first
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec


def value_dtypes(spec: LayerSpec) -> list[torch.dtype] | None:
    """The inputs' dtypes, then each step's result's as the reference computes it (torch's type promotion, run on
    one-element tensors of each input's rank: a 0-d value promotes as a scalar); None where a dtype is unknown."""
    from kiln.kinds import run_reference

    if any(v is None or v.dtype is None or v.dtype.torch is None or v.shape is None for v in spec.inputs):
        return None
    values = [torch.ones((1,) * len(v.shape), dtype=v.dtype.torch) for v in spec.inputs]
    for step in spec.attrs["program"]:
        kind, refs, _ = step
        values.append(run_reference(kind, [None if r is None else values[r] for r in refs],
                                    pointwise_chain.step_attrs(step))[0])
    return [v.dtype for v in values]


def _broadcasts(shape: tuple, to: tuple) -> bool:
    """Whether a static `shape` broadcasts to `to` (numpy's rules, dims of `to` known where `shape`'s are not 1)."""
    if not all(isinstance(d, int) for d in shape) or len(shape) > len(to):
        return False
    return all(d == 1 or d == t for d, t in zip(reversed(shape), reversed(to)))


def _supports(spec: LayerSpec, device) -> str | None:
    out = spec.outputs[0]
    if out.shape is None or not any(v.shape == out.shape for v in spec.inputs):
        return "no input of the output's shape"
    for v in spec.inputs:
        if v.shape != out.shape and not _broadcasts(v.shape, out.shape):
            return f"an input of shape {list(v.shape)} does not broadcast to the output's {list(out.shape)}"
    dtypes = value_dtypes(spec)
    if dtypes is None:
        return "a value of unknown dtype"
    if dtypes[-1] != out.dtype.torch:
        return "the program's result dtype is not the layer's"
    return pointwise_chain.reason(spec.attrs["program"], dtypes)


def _configs(spec: LayerSpec, device, level: int):
    return pointwise.CONFIGS[:1] if level <= 1 else list(pointwise.CONFIGS)


def _compile(spec: LayerSpec, config, device):
    program, dtypes = spec.attrs["program"], value_dtypes(spec)
    full = next(i for i, v in enumerate(spec.inputs) if v.shape == spec.outputs[0].shape)

    def run(inputs, out=None):
        shape = tuple(inputs[full].shape)
        return [pointwise_chain.chain(program, dtypes, list(inputs), shape, config, first(out))]

    return run


register(Tactic("triton_pointwise_chain", ("PointwiseChain",), _compile, _supports, _configs, priority=20,
                writes_out=True))
