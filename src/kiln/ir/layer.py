"""A layer of the network IR: one operation of a registered kind, with its provenance."""

from __future__ import annotations

from typing import Any

from kiln.ir.dtype import DType


class Layer:
    """One operation. Inputs and outputs are tensor names; "" marks an omitted optional input.

    `origin` lists the ONNX node names this layer was made from (several after fusion).
    `precision` is the compute dtype chosen by the precision passes (None: the inputs' own).
    """

    __slots__ = ("name", "kind", "inputs", "outputs", "attrs", "precision", "origin")

    def __init__(self, name: str, kind: str, inputs: list[str], outputs: list[str],
                 attrs: dict[str, Any] | None = None, precision: DType | None = None,
                 origin: list[str] | None = None):
        self.name = name
        self.kind = kind
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs or {})
        self.precision = precision
        self.origin = list(origin if origin is not None else [name])

    def __repr__(self) -> str:
        return f"Layer({self.name!r}, {self.kind})"
