"""What a tactic sees of a layer: kind, attributes, input/output types and constant inputs; and its signature.

The signature is the timing-cache key part that describes the layer (kind, attributes, shapes,
dtypes, which inputs are constants): two layers with equal signatures get the same tactic.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir import DType, Layer, Network


@dataclass(frozen=True)
class ValueSpec:
    """One input or output: dtype, shape (None when unknown or symbolic) and, for constants, the value."""

    dtype: DType | None
    shape: tuple | None
    const: torch.Tensor | None = None

    @property
    def static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)


@dataclass(frozen=True)
class LayerSpec:
    """A layer as tactics see it (constants already on the target device)."""

    name: str
    kind: str
    attrs: dict[str, Any]
    inputs: tuple[ValueSpec | None, ...]
    outputs: tuple[ValueSpec, ...]
    precision: DType | None = None
    tf32: bool = False
    _sig: list = field(default_factory=list, compare=False, repr=False)

    @property
    def static(self) -> bool:
        """Every input and every output some layer reads has a static shape (an unread output has none)."""
        return all(v is None or v.static for v in self.inputs) and all(v.static or v.dtype is None
                                                                       for v in self.outputs)

    def signature(self) -> str:
        """A stable hash of everything about the layer that can change which tactic is fastest or valid."""
        if not self._sig:
            self._sig.append(self._hash(floats=True))
        return self._sig[0]

    def shape_signature(self) -> str:
        """The signature with every float attribute's value left out (an int8 layer's scales, an epsilon): layers
        equal here run the same kernels at the same speed, though a tactic's validity must still be checked."""
        return self._hash(floats=False)

    def _hash(self, floats: bool) -> str:
        def enc(v):
            if isinstance(v, torch.Tensor):
                return ["tensor", str(v.dtype), list(v.shape)]
            if isinstance(v, DType):
                return v.value
            if isinstance(v, (list, tuple)):
                return [enc(x) for x in v]
            if isinstance(v, dict):
                return {str(k): enc(x) for k, x in sorted(v.items())}
            if isinstance(v, float) and not floats:
                return "float"
            return v if isinstance(v, (int, float, str, bool)) or v is None else type(v).__name__

        body = {"kind": self.kind, "attrs": enc(self.attrs), "tf32": self.tf32,
                "precision": self.precision.value if self.precision else None,
                "in": [None if v is None else [str(v.dtype), enc(list(v.shape or [])), v.const is not None]
                       for v in self.inputs],
                "out": [[str(v.dtype), enc(list(v.shape or []))] for v in self.outputs]}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]


def layer_spec(net: Network, layer: Layer, weights: dict[str, torch.Tensor], tf32: bool = False) -> LayerSpec:
    """The spec of `layer`; `weights` are the network's constants as the engine holds them (on its device)."""

    def value(name: str) -> ValueSpec | None:
        if not name:
            return None
        t = net.tensors.get(name)
        kind = getattr(t, "kind", "tensor") if t is not None else "tensor"
        if t is None or kind != "tensor":
            return ValueSpec(None, None)
        return ValueSpec(t.dtype, t.shape, weights.get(name))

    return LayerSpec(layer.name, layer.kind, layer.attrs, tuple(value(i) for i in layer.inputs),
                     tuple(value(o) or ValueSpec(None, None) for o in layer.outputs), layer.precision, tf32)
