"""The layer-kind registry: each kind's one reference implementation (torch, any device).

A reference takes the layer's input tensors (None for an omitted optional input) and its
attributes, and returns one tensor or a sequence of them (one per layer output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from kiln.errors import InternalError

Reference = Callable[[list[torch.Tensor | None], dict[str, Any]], torch.Tensor | Sequence[torch.Tensor]]


@dataclass(frozen=True)
class LayerKind:
    """A layer kind: its name, the function that defines its semantics, and whether it is pure.

    A pure kind's outputs depend only on its inputs and attributes, so constant folding may run it
    at build time; random kinds are not pure.
    """

    name: str
    reference: Reference
    pure: bool = True


KINDS: dict[str, LayerKind] = {}


def kind(*names: str, pure: bool = True):
    """Register the decorated function as the reference implementation of each named kind."""

    def deco(fn: Reference) -> Reference:
        for name in names:
            if name in KINDS:
                raise InternalError(f"layer kind {name!r} registered twice")
            KINDS[name] = LayerKind(name, fn, pure)
        return fn

    return deco


def get(name: str) -> LayerKind:
    try:
        return KINDS[name]
    except KeyError:
        raise InternalError(f"no reference implementation for layer kind {name!r}") from None


def run_reference(kind_name: str, inputs: list[torch.Tensor | None], attrs: dict[str, Any]) -> list[torch.Tensor]:
    """Run a kind's reference and always return a list of outputs."""
    out = get(kind_name).reference(inputs, attrs)
    return [out] if isinstance(out, (torch.Tensor, np.ndarray)) else list(out)
