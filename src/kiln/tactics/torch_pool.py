"""Pooling through torch's native cuDNN/ATen kernels (the references unfold windows for generality)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.tactics.common import float_io, rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

_MAX = {3: F.max_pool1d, 4: F.max_pool2d, 5: F.max_pool3d}
_AVG = {3: F.avg_pool1d, 4: F.avg_pool2d, 5: F.avg_pool3d}


def _supports_window(spec: LayerSpec, device) -> str | None:
    a, r = spec.attrs, rank(spec.inputs[0])
    if r not in _MAX:
        return "only 1-D, 2-D and 3-D pooling"
    if a.get("auto_pad", "NOTSET") != "NOTSET":
        return "pads are not explicit"
    n, pads = r - 2, list(a["pads"])
    if pads[:n] != pads[n:] or any(2 * p > k for p, k in zip(pads[:n], a["kernel_shape"])):
        return "asymmetric pads, or pads over half the kernel"
    if len(spec.outputs) > 1 and spec.outputs[1].dtype is not None:
        return "MaxPool Indices output is requested"
    if spec.kind == "AveragePool" and any(d != 1 for d in a.get("dilations", [1] * n)):
        return "dilated average pooling"
    return float_io(LayerSpec(spec.name, spec.kind, {}, spec.inputs[:1], spec.outputs[:1]))


def _compile_window(spec: LayerSpec, config, device):
    a = spec.attrs
    r = rank(spec.inputs[0])
    n = r - 2
    k, s, p, ceil = a["kernel_shape"], a["strides"], a["pads"][:n], bool(a.get("ceil_mode", 0))
    if spec.kind == "MaxPool":
        fn, d = _MAX[r], a.get("dilations", [1] * n)
        return lambda inputs: [fn(inputs[0], k, s, p, d, ceil_mode=ceil)]
    fn, include = _AVG[r], bool(a.get("count_include_pad", 0))
    return lambda inputs: [fn(inputs[0], k, s, p, ceil_mode=ceil, count_include_pad=include)]


def _compile_global(spec: LayerSpec, config, device):
    dims = tuple(range(2, rank(spec.inputs[0])))
    if spec.kind == "GlobalMaxPool":
        return lambda inputs: [inputs[0].amax(dim=dims, keepdim=True)]
    return lambda inputs: [inputs[0].mean(dim=dims, keepdim=True, dtype=torch.float32).to(inputs[0].dtype)]


register(Tactic("torch_pool", ("MaxPool", "AveragePool"), _compile_window, _supports_window, priority=10, fresh=True))
register(Tactic("torch_global_pool", ("GlobalAveragePool", "GlobalMaxPool"), _compile_global,
                lambda spec, device: (None if rank(spec.inputs[0]) in (3, 4, 5) else "input rank unknown")
                or float_io(spec), priority=10, fresh=True))
