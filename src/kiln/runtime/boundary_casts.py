"""The float Casts at an engine's edges that a CUDA graph replay folds into the copies it makes anyway.

An input read only by a Cast is copied into the graph's static buffer in the Cast's type, and an output made by a
Cast leaves the graph uncast and is converted as the replay copies it out: each fold is one kernel less a replay
(an fp16 engine fed fp32 images saves two, about 2-3 µs each at batch 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kiln.ir import Layer, Network
from kiln.ir.dtype import DType

FLOATS = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)


@dataclass(frozen=True)
class BoundaryCasts:
    """`inputs`: engine input → dtype of its static buffer (its Cast's); `declared`: those inputs' own dtypes;
    `outputs`: engine output → dtype the replay converts it to; `layers`: the folded Casts' indices."""

    inputs: dict[str, torch.dtype] = field(default_factory=dict)
    declared: dict[str, torch.dtype] = field(default_factory=dict)
    outputs: dict[str, torch.dtype] = field(default_factory=dict)
    layers: frozenset[int] = frozenset()


def _float_cast(net: Network, layer: Layer) -> bool:
    if layer.kind != "Cast" or not layer.inputs or not layer.inputs[0] or not layer.outputs[0]:
        return False
    src = net.tensors.get(layer.inputs[0])
    return src is not None and src.kind == "tensor" and src.dtype in FLOATS and layer.attrs.get("to") in FLOATS


def boundary_casts(net: Network) -> BoundaryCasts:
    """The Casts a graph replay can fold: on an input that nothing else reads (and is no output), or making an
    output that nothing reads (and is no input)."""
    users = net.consumers()
    ins, declared, outs, layers = {}, {}, {}, set()
    for k, layer in enumerate(net.layers):
        if not _float_cast(net, layer):
            continue
        src, dst, to = layer.inputs[0], layer.outputs[0], layer.attrs["to"].torch
        if src in net.inputs and src not in net.outputs and len(users.get(src, ())) == 1:
            ins[src], declared[src] = to, net.tensors[src].dtype.torch
            layers.add(k)
        if dst in net.outputs and net.outputs.count(dst) == 1 and dst not in net.inputs and not users.get(dst):
            outs[dst] = to
            layers.add(k)
    return BoundaryCasts(ins, declared, outs, frozenset(layers))


def passthrough(inputs: list, out=None) -> list:
    """A folded Cast inside the graph: its input as it is (the replay converts on the way in or out)."""
    return [inputs[0]]
