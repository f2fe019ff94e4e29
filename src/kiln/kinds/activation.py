"""Reference implementations of activation kinds."""

from __future__ import annotations

import torch

from kiln.kinds.registry import kind


@kind("Relu")
def relu(inputs, attrs):
    return torch.relu(inputs[0])
