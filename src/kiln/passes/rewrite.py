"""Small rewriting helpers shared by the passes."""

from __future__ import annotations

import torch

from kiln.ir import Layer, Network


def single_consumer(net: Network, tensor: str, consumers: dict[str, list[Layer]] | None = None) -> Layer | None:
    """The one layer reading `tensor`, or None if it has several readers or is a network output."""
    users = (consumers if consumers is not None else net.consumers()).get(tensor, [])
    if len(users) != 1 or tensor in net.outputs:
        return None
    return users[0]


def make_constant(net: Network, name: str, value: torch.Tensor) -> None:
    """Turn tensor `name` (produced by a layer being removed) into a constant with `value`."""
    net.constants[name] = value
    t = net.tensors[name]
    t.shape = tuple(value.shape)


def constant_inputs(net: Network, layer: Layer) -> list[torch.Tensor | None] | None:
    """The layer's input values if every present input is a constant tensor, else None."""
    values = []
    for i in layer.inputs:
        if not i:
            values.append(None)
        elif i in net.constants:
            values.append(net.constants[i])
        else:
            return None
    return values
