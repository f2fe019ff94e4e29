"""The ONNX op registry: importers that turn one ONNX node into IR layers.

`@register("Conv", since=11)` registers an importer for opsets >= 11 (until a newer one);
`register_direct(...)` maps ops one-to-one onto the layer kind of the same name, with the
schema's attribute defaults filled in so that layers never depend on ONNX defaults.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

import onnx
import torch

from kiln.errors import InternalError, ModelError
from kiln.ir import DType, Layer, Network


@dataclass
class OnnxNode:
    """An ONNX node as plain Python values (no protobuf past this point)."""

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    opset: int

    def where(self) -> str:
        dom = self.domain or "ai.onnx"
        return f"node {self.name!r} ({dom}::{self.op_type}, opset {self.opset})"

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


@dataclass
class ImportContext:
    """What an importer may touch: the network under construction and its constant values."""

    network: Network
    opsets: dict[str, int]
    _names: set[str] = field(default_factory=set)

    def emit(self, node: OnnxNode, kind: str, inputs: list[str], outputs: list[str],
             attrs: dict[str, Any] | None = None) -> Layer:
        """Append a layer made from `node`; its new output tensors are typed from ONNX inference
        unless the importer types them itself (`network.add_tensor`)."""
        name = node.name if node.name not in self._names else self.network.unique_name(node.name)
        self._names.add(name)
        layer = Layer(name, kind, inputs, outputs, attrs, origin=[node.name])
        self.network.layers.append(layer)
        return layer

    def constant(self, name: str) -> torch.Tensor | None:
        return self.network.constants.get(name) if name else None

    def require_constant(self, node: OnnxNode, name: str, what: str) -> torch.Tensor:
        value = self.constant(name)
        if value is None:
            raise ModelError(f"{node.where()}: {what} (input {name!r}) must be a constant for kiln to import it")
        return value

    def add_constant(self, name: str, value: torch.Tensor) -> str:
        if name in self.network.tensors:
            name = self.network.unique_name(name)
        self.network.add_constant(name, value)
        return name


Importer = Callable[[OnnxNode, ImportContext], None]

# (domain, op_type) -> sorted list of (since_version, importer)
IMPORTERS: dict[tuple[str, str], list[tuple[int, Importer]]] = {}


def register(op_type: str, since: int = 1, domain: str = ""):
    """Register the decorated importer for `op_type` from opset `since` on."""

    def deco(fn: Importer) -> Importer:
        versions = IMPORTERS.setdefault((domain, op_type), [])
        if any(v == since for v, _ in versions):
            raise InternalError(f"importer for {op_type} since {since} registered twice")
        bisect.insort(versions, (since, fn), key=lambda p: p[0])
        return fn

    return deco


def lookup(domain: str, op_type: str, opset: int) -> Importer | None:
    versions = IMPORTERS.get(("" if domain == "ai.onnx" else domain, op_type), [])
    chosen = None
    for since, fn in versions:
        if since <= opset:
            chosen = fn
    return chosen


def schema_defaults(node: OnnxNode) -> dict[str, Any]:
    """Attributes of the node's schema that have default values, as Python values."""
    try:
        schema = onnx.defs.get_schema(node.op_type, node.opset, node.domain)
    except onnx.defs.SchemaError:
        return {}
    out = {}
    for name, attr in schema.attributes.items():
        if attr.default_value.name or attr.default_value.type:
            out[name] = attribute_value(attr.default_value)
    return out


def tensor_value(t: onnx.TensorProto, where: str) -> Any:
    """A TensorProto's value as a CPU torch tensor; data that does not match its dims or type is a ModelError."""
    from kiln.ir.dtype import to_torch

    try:
        return to_torch(onnx.numpy_helper.to_array(t))
    except (ValueError, TypeError, KeyError, OverflowError, MemoryError) as e:
        raise ModelError(f"{where} {t.name!r}: its data does not match its dims {list(t.dims)} and type "
                         f"{t.data_type} ({str(e)[:120]}); re-export the model") from None


def attribute_value(attr: onnx.AttributeProto) -> Any:
    """AttributeProto → plain Python value (tensors become CPU torch tensors, bytes become str)."""
    A = onnx.AttributeProto
    if attr.type == A.TENSOR:
        return tensor_value(attr.t, f"tensor attribute {attr.name!r}")
    if attr.type == A.STRING:
        return attr.s.decode("utf-8", "replace")
    if attr.type == A.STRINGS:
        return [s.decode("utf-8", "replace") for s in attr.strings]
    if attr.type in (A.GRAPH, A.GRAPHS, A.SPARSE_TENSOR, A.SPARSE_TENSORS, A.TENSORS, A.TYPE_PROTO, A.TYPE_PROTOS):
        return attr  # left as protobuf for importers that handle it; others reject it
    value = onnx.helper.get_attribute_value(attr)
    return list(value) if isinstance(value, (list, tuple)) else value


def direct(op_type: str, node: OnnxNode, ctx: ImportContext, kind: str | None = None) -> Layer:
    """Import `node` as one layer of kind `kind` (default: the op's name) with defaults filled in."""
    attrs = schema_defaults(node)
    attrs.update(node.attrs)
    return ctx.emit(node, kind or op_type, node.inputs, node.outputs, attrs)


def register_direct(*op_types: str, since: int = 1, domain: str = "") -> None:
    """Register one-to-one importers for ops whose layer kind has the op's name and attributes."""
    for op in op_types:
        register(op, since, domain)(lambda node, ctx, _op=op: direct(_op, node, ctx))


def dtype_of(ctx: ImportContext, name: str) -> DType:
    t = ctx.network.tensors.get(name)
    if t is None:
        raise InternalError(f"tensor {name!r} has no type yet")
    return t.dtype
