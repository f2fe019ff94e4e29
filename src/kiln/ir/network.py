"""The network IR: inputs, outputs, constants and layers in topological order."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import numpy as np
import torch

from kiln.errors import InternalError
from kiln.ir.dtype import DType
from kiln.ir.layer import Layer
from kiln.ir.tensor import Tensor


class Network:
    """A typed dataflow graph. Constants are CPU torch tensors (numpy object arrays for strings) keyed by name.

    Control-flow layers hold their bodies as nested Networks in attributes (see kinds/controlflow.py).
    """

    __slots__ = ("name", "inputs", "outputs", "tensors", "layers", "constants", "_ids")

    def __init__(self, name: str = "network"):
        self.name = name
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.tensors: dict[str, Tensor] = {}
        self.layers: list[Layer] = []
        self.constants: dict[str, torch.Tensor] = {}
        self._ids = itertools.count()

    # -- building -------------------------------------------------------------------------
    def add_tensor(self, name: str, dtype: DType, shape, kind: str = "tensor") -> Tensor:
        t = Tensor(name, dtype, shape, kind)
        self.tensors[name] = t
        return t

    def add_constant(self, name: str, value: torch.Tensor) -> Tensor:
        self.constants[name] = value
        return self.add_tensor(name, DType.from_torch(value.dtype), tuple(value.shape))

    def unique_name(self, base: str) -> str:
        while True:
            name = f"{base}__{next(self._ids)}"
            if name not in self.tensors and all(l.name != name for l in self.layers):
                return name

    # -- queries --------------------------------------------------------------------------
    def producers(self) -> dict[str, Layer]:
        return {o: layer for layer in self.layers for o in layer.outputs if o}

    def consumers(self) -> dict[str, list[Layer]]:
        users: dict[str, list[Layer]] = {}
        for layer in self.layers:
            for i in layer.inputs:
                if i:
                    users.setdefault(i, []).append(layer)
        return users

    def constant(self, name: str) -> torch.Tensor | None:
        return self.constants.get(name)

    def replace_uses(self, old: str, new: str) -> None:
        """Point every reader of tensor `old` (layers and network outputs) at `new`."""
        for layer in self.layers:
            layer.inputs = [new if i == old else i for i in layer.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]

    def weight_bytes(self) -> int:
        return sum(c.nbytes for c in self.constants.values())

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    # -- checking -------------------------------------------------------------------------
    def verify(self, check_layer: Callable[[Layer], None] | None = None) -> None:
        """Raise InternalError unless every tensor is defined once, before use, with a type; `check_layer` checks
        each layer further (kiln.kinds.verify.verify_network passes the per-kind checks: registered kind,
        declared attributes, bodies)."""
        defined = set(self.inputs) | set(self.constants)
        for name in defined:
            if name not in self.tensors:
                raise InternalError(f"tensor {name!r} has no type")
        names = set()
        for layer in self.layers:
            if layer.name in names:
                raise InternalError(f"layer name {layer.name!r} used twice")
            names.add(layer.name)
            if check_layer is not None:
                check_layer(layer)
            for i in layer.inputs:
                if i and i not in defined:
                    raise InternalError(f"layer {layer.name!r} reads {i!r} before it is defined")
            for o in layer.outputs:
                if not o:
                    continue
                if o in defined:
                    raise InternalError(f"tensor {o!r} is defined twice (by layer {layer.name!r})")
                if o not in self.tensors:
                    raise InternalError(f"output {o!r} of layer {layer.name!r} has no type")
                defined.add(o)
        for o in self.outputs:
            if o not in defined:
                raise InternalError(f"network output {o!r} is never defined")

    # -- printing -------------------------------------------------------------------------
    def __str__(self) -> str:
        def t(name: str) -> str:
            return repr(self.tensors[name]) if name in self.tensors else (name or "<none>")

        lines = [f"network {self.name}"]
        lines += [f"  input  {t(n)}" for n in self.inputs]
        for c, v in self.constants.items():
            lines.append(f"  const  {c}: {DType.from_torch(v.dtype)}{list(v.shape)}")
        for k, layer in enumerate(self.layers):
            attrs = ", ".join(f"{a}={_short(v)}" for a, v in layer.attrs.items())
            prec = f" @{layer.precision}" if layer.precision else ""
            lines.append(f"  {k:4d} {layer.kind}{prec} {layer.name}({', '.join(layer.inputs)}) -> "
                         f"{', '.join(t(o) for o in layer.outputs)}" + (f"  {{{attrs}}}" if attrs else ""))
            for a, v in layer.attrs.items():
                if isinstance(v, Network):
                    lines += [f"         {a}: " + line if i == 0 else "         " + line
                              for i, line in enumerate(str(v).splitlines())]
        lines += [f"  output {t(n)}" for n in self.outputs]
        return "\n".join(lines)


def _short(v) -> str:
    if isinstance(v, Network):
        return f"<network {v.name}>"
    if isinstance(v, (np.ndarray, torch.Tensor)):
        return f"tensor{list(v.shape)}"
    s = repr(v)
    return s if len(s) < 60 else s[:57] + "..."
