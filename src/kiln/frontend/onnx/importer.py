"""Translate a validated ONNX ModelProto into a kiln Network through the op registry.

Subgraphs (If/Loop/Scan/SequenceMap bodies) import recursively into nested Networks. A body that
reads a value of an enclosing graph *captures* it: the value becomes one of the body's last inputs
and the importer passes it as an extra input of the layer, so that liveness and passes see the read.
Small constants are copied into the body instead, where importers can read their values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx import ops  # noqa: F401  (registers importers)
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, attribute_value, lookup, tensor_value
from kiln.ir import DType, Network

ValueType = tuple[DType, tuple | None, str]  # element dtype, element shape, value kind (see ir/tensor.py)

INLINE_CONSTANT_BYTES = 4096  # captured constants up to this size are copied into the body


def _shape(tt: onnx.TypeProto.Tensor):
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)


def value_type(tp: onnx.TypeProto) -> ValueType | None:
    """The kiln type of a tensor, sequence-of-tensors or optional type proto; None where unknown or other."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tt = tp.tensor_type
        return (DType.from_onnx(tt.elem_type), _shape(tt), "tensor") if tt.elem_type else None
    inner = value_type(tp.sequence_type.elem_type) if which == "sequence_type" else \
        value_type(tp.optional_type.elem_type) if which == "optional_type" else None
    if inner is None or inner[2] not in ("tensor", "sequence") or (which == "sequence_type" and inner[2] != "tensor"):
        return None
    kind = "sequence" if which == "sequence_type" else "optional" if inner[2] == "tensor" else "optional_sequence"
    return inner[0], inner[1], kind


def value_types(graph: onnx.GraphProto) -> dict[str, ValueType]:
    """Known types of every graph input, output and value_info entry."""
    out = {}
    boundary = {i.name for i in graph.input} | {o.name for o in graph.output}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        try:
            t = value_type(vi.type)
        except ModelError:
            if vi.name in boundary:
                raise
            continue
        if t is not None:
            out[vi.name] = t
    return out


@dataclass
class GraphContext(ImportContext):
    """The import context of one graph or body: its ONNX value types and, for a body, the enclosing context."""

    types: dict[str, ValueType] = field(default_factory=dict)
    parent: GraphContext | None = None
    captures: list[str] = field(default_factory=list)

    def resolve(self, name: str) -> bool:
        """Whether `name` is visible here; a value of an enclosing graph is captured (or copied, if small)."""
        net = self.network
        if name in net.tensors:
            return True
        if self.parent is None or not self.parent.resolve(name):
            return False
        outer = self.parent.network
        value = outer.constants.get(name)
        if value is not None and value.nbytes <= INLINE_CONSTANT_BYTES:
            net.add_constant(name, value)
        else:
            t = outer.tensors[name]
            net.add_tensor(name, t.dtype, t.shape, t.kind)
            net.inputs.append(name)
            self.captures.append(name)
        return True

    def bodies(self, node: OnnxNode, graphs: list[tuple[onnx.GraphProto, list[ValueType | None]]]
               ) -> tuple[list[Network], list[str]]:
        """Import `node`'s bodies (each with fallback types for its undeclared inputs); every body gets the
        union of their captures as its last inputs, in the order returned."""
        subs = []
        for graph, input_types in graphs:
            sub = GraphContext(Network(graph.name or f"{node.name}_body"), self.opsets,
                               types=value_types(graph), parent=self)
            import_graph(graph, sub, input_types)
            subs.append(sub)
        captures = list(dict.fromkeys(c for sub in subs for c in sub.captures))
        for sub in subs:
            net, own = sub.network, set(sub.captures)
            for c in captures:
                if c not in own:
                    t = self.network.tensors[c]
                    net.add_tensor(c, t.dtype, t.shape, t.kind)
            net.inputs = [i for i in net.inputs if i not in own] + captures
        return [sub.network for sub in subs], captures

    def type_missing(self, names: list[str], types: list[ValueType | None]) -> None:
        """Type outputs that ONNX inference left untyped from what the importer knows (e.g. its body)."""
        for name, t in zip(names, types):
            if name and t is not None and name not in self.types and name not in self.network.tensors:
                self.network.add_tensor(name, *t)


def import_graph(graph: onnx.GraphProto, ctx: GraphContext, input_types: list[ValueType | None] = ()) -> None:
    """Import `graph`'s initializers, inputs, nodes and outputs into `ctx.network`."""
    net, types = ctx.network, ctx.types
    for init in graph.initializer:
        net.add_constant(init.name, tensor_value(init, "initializer"))
    for k, vi in enumerate(graph.input):
        if vi.name in net.constants:
            continue  # an initializer listed as input (IR < 4 style): a constant
        t = types.get(vi.name) or (input_types[k] if k < len(input_types) else None)
        if t is None:
            raise UnsupportedOpError(f"graph input {vi.name!r} has no type kiln supports (a typed tensor, sequence "
                                     "of tensors, or optional); declare its element type in the model")
        net.add_tensor(vi.name, *t)
        net.inputs.append(vi.name)

    for index, n in enumerate(graph.node):
        _import_node(n, index, ctx)

    for vi in graph.output:
        if not ctx.resolve(vi.name):
            raise ModelError(f"graph output {vi.name!r} of graph {net.name!r} is never produced")
        net.outputs.append(vi.name)
        declared, t = types.get(vi.name), net.tensors[vi.name]
        if declared is not None and declared[2] == t.kind:  # declared output shapes win over inferred ones
            t.shape = declared[1]


def _import_node(n: onnx.NodeProto, index: int, ctx: GraphContext) -> None:
    net = ctx.network
    domain = "" if n.domain == "ai.onnx" else n.domain
    node = OnnxNode(n.name or f"{n.op_type}_{index}", n.op_type, domain, list(n.input), list(n.output),
                    {a.name: attribute_value(a) for a in n.attribute}, ctx.opsets.get(domain, 0))
    for i in node.inputs:
        if i and not ctx.resolve(i):
            raise ModelError(f"{node.where()}: input {i!r} is not produced by any earlier node, initializer "
                             "or graph input (missing producer or a cycle)")
    fn = lookup(domain, n.op_type, node.opset)
    if fn is None:
        raise UnsupportedOpError(f"{node.where()}: op not supported by kiln; supply it as a plugin "
                                 "(kiln.plugins.register_op)")
    start = len(net.layers)
    fn(node, ctx)
    for layer in net.layers[start:]:
        for o in layer.outputs:
            if o and o not in net.tensors:
                if o not in ctx.types:
                    raise ModelError(f"{node.where()}: ONNX shape inference gave no type for output {o!r}, and kiln "
                                     "needs every value's element type; declare it in the graph's value_info "
                                     "(onnx.helper.make_tensor_value_info) or fix what stops inference "
                                     "(onnx.shape_inference.infer_shapes(model, strict_mode=True) says what)")
                net.add_tensor(o, *ctx.types[o])


def import_onnx(proto: onnx.ModelProto, name: str = "model") -> Network:
    graph = proto.graph
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    ctx = GraphContext(Network(graph.name or name), opsets, types=value_types(graph))
    import_graph(graph, ctx)
    return ctx.network
