"""Translate a validated ONNX ModelProto into a kiln Network through the op registry."""

from __future__ import annotations

import onnx

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx import ops  # noqa: F401  (registers importers)
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, attribute_value, lookup
from kiln.ir import DType, Network
from kiln.ir.dtype import to_torch


def _shape(tt: onnx.TypeProto.Tensor):
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)


def value_types(graph: onnx.GraphProto) -> dict[str, tuple[DType, tuple | None]]:
    """Known (dtype, shape) of every graph input, output and value_info entry."""
    out = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            tt = vi.type.tensor_type
            try:
                out[vi.name] = (DType.from_onnx(tt.elem_type), _shape(tt))
            except ModelError:
                if vi.name in {i.name for i in graph.input} | {o.name for o in graph.output}:
                    raise
    return out


def import_onnx(proto: onnx.ModelProto, name: str = "model") -> Network:
    graph = proto.graph
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    net = Network(graph.name or name)
    ctx = ImportContext(net, opsets)
    types = value_types(graph)

    for init in graph.initializer:
        net.add_constant(init.name, to_torch(onnx.numpy_helper.to_array(init)))
    for vi in graph.input:
        if vi.name in net.constants:
            continue  # an initializer listed as input (IR < 4 style): a constant
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"graph input {vi.name!r} is not a tensor; kiln takes tensor inputs only")
        if vi.name not in types:
            raise ModelError(f"graph input {vi.name!r} has no element type")
        dtype, shape = types[vi.name]
        net.add_tensor(vi.name, dtype, shape)
        net.inputs.append(vi.name)

    for index, n in enumerate(graph.node):
        domain = "" if n.domain == "ai.onnx" else n.domain
        node = OnnxNode(n.name or f"{n.op_type}_{index}", n.op_type, domain, list(n.input), list(n.output),
                        {a.name: attribute_value(a) for a in n.attribute}, opsets.get(domain, 0))
        for i in node.inputs:
            if i and i not in net.tensors:
                raise ModelError(f"{node.where()}: input {i!r} is not produced by any earlier node, "
                                 "initializer or graph input (missing producer or a cycle)")
        fn = lookup(domain, n.op_type, node.opset)
        if fn is None:
            raise UnsupportedOpError(f"{node.where()}: op not supported by kiln; supply it as a plugin "
                                     "(kiln.plugins.register_op)")
        start = len(net.layers)
        fn(node, ctx)
        for layer in net.layers[start:]:
            for o in layer.outputs:
                if o and o not in net.tensors:
                    if o not in types:
                        raise ModelError(f"{node.where()}: ONNX shape inference gave no type for output {o!r}")
                    net.add_tensor(o, *types[o])

    for vi in graph.output:
        if vi.name not in net.tensors:
            raise ModelError(f"graph output {vi.name!r} is never produced")
        net.outputs.append(vi.name)
        if vi.name in types:  # declared output types win over inferred ones
            net.tensors[vi.name].shape = types[vi.name][1]
    return net
