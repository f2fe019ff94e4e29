"""The layer-kind registry: each kind's one reference implementation (torch, any device).

A reference takes the layer's input tensors (None for an omitted optional input) and its
attributes, and returns one tensor or a sequence of them (one per layer output).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from kiln.errors import InternalError

Reference = Callable[[list[torch.Tensor | None], dict[str, Any]], torch.Tensor | Sequence[torch.Tensor]]


@dataclass(frozen=True)
class AttrSpec:
    """What a kind accepts under one attribute name: the values it takes (`what`, tested by `accepts` on the
    attribute as a layer holds it: lists for tuples, tensors, DTypes, Networks) and whether it must be present.
    `INT.req` is the required form; `FLOAT | NONE` accepts either."""

    what: str
    accepts: Callable[[Any], bool]
    required: bool = False

    @property
    def req(self) -> AttrSpec:
        return replace(self, required=True)

    def __or__(self, other: AttrSpec) -> AttrSpec:
        a, b = self.accepts, other.accepts
        return AttrSpec(f"{self.what} or {other.what}", lambda v: a(v) or b(v), self.required or other.required)


def _seq(v: Any) -> bool:
    return isinstance(v, (list, tuple))


def list_of(item: AttrSpec) -> AttrSpec:
    return AttrSpec(f"a list of ({item.what})", lambda v: _seq(v) and all(item.accepts(x) for x in v))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float))


def _dtype(v: Any) -> bool:
    from kiln.ir import DType
    return isinstance(v, DType)


def _network(v: Any) -> bool:
    from kiln.ir import Network
    return isinstance(v, Network)


INT = AttrSpec("an int", lambda v: isinstance(v, int))  # bools too: ONNX writes flags as ints
FLOAT = AttrSpec("a number", _number)
BOOL = INT
STR = AttrSpec("a string", lambda v: isinstance(v, str))
NONE = AttrSpec("None", lambda v: v is None)
INTS = list_of(INT)
FLOATS = list_of(FLOAT)
STRS = list_of(STR)
TENSOR = AttrSpec("a tensor", lambda v: isinstance(v, torch.Tensor))
DTYPE = AttrSpec("a dtype", _dtype)
NETWORK = AttrSpec("a network", _network)


@dataclass(frozen=True)
class LayerKind:
    """A layer kind: its name, the function that defines its semantics, whether it is pure, and the
    attributes it takes (name → AttrSpec; None, for plugin ops only: any). A plugin op's kind also says where it
    came from (`plugin`: the registering module's "module" and "file" names and its source's "sha256"), which a plan
    records as data.

    A pure kind's outputs depend only on its inputs and attributes, so constant folding may run it
    at build time; random kinds are not pure.
    """

    name: str
    reference: Reference
    pure: bool = True
    attrs: Mapping[str, AttrSpec] | None = None
    plugin: Mapping[str, str] | None = None


KINDS: dict[str, LayerKind] = {}


def kind(*names: str, pure: bool = True, attrs: Mapping[str, AttrSpec] | None = None):
    """Register the decorated function as the reference implementation of each named kind, taking `attrs`."""

    def deco(fn: Reference) -> Reference:
        for name in names:
            if name in KINDS:
                raise InternalError(f"layer kind {name!r} registered twice")
            KINDS[name] = LayerKind(name, fn, pure, attrs)
        return fn

    return deco


def attr_problem(kind_name: str, attrs: Mapping[str, Any]) -> str | None:
    """What is wrong with a layer's attributes for its kind's declaration (an unknown name, a missing required
    one, a value of another type), or None."""
    declared = KINDS[kind_name].attrs if kind_name in KINDS else None
    if declared is None:
        return None
    for key, value in attrs.items():
        spec = declared.get(key)
        if spec is None:
            return f"unknown attribute {key!r} (a {kind_name} layer takes {sorted(declared) or 'none'})"
        if not spec.accepts(value):
            return f"attribute {key!r} is {type(value).__name__} {_short(value)}, expected {spec.what}"
    missing = [k for k, spec in declared.items() if spec.required and k not in attrs]
    return f"required attribute {missing[0]!r} is missing" if missing else None


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def get(name: str) -> LayerKind:
    try:
        return KINDS[name]
    except KeyError:
        raise InternalError(f"no reference implementation for layer kind {name!r}") from None


def run_reference(kind_name: str, inputs: list[torch.Tensor | None], attrs: dict[str, Any]) -> list[torch.Tensor]:
    """Run a kind's reference and always return a list of outputs."""
    out = get(kind_name).reference(inputs, attrs)
    return [out] if isinstance(out, (torch.Tensor, np.ndarray)) else list(out)
