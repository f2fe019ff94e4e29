"""A model's structure without its large weights, for the ONNX checker and shape inference: both copy the whole
model through C++ (twice for inference), which for a 440 MB BERT took most of the load. Large initializers become
graph inputs of the same type and shape; their data is checked by the importer when it reads them."""

from __future__ import annotations

import math

import onnx

LARGE_BYTES = 64 * 1024  # shape arithmetic reads small integer initializers; weights are far larger


def weightless(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` whose initializers over LARGE_BYTES are typed graph inputs instead (no weight is copied)."""
    g = proto.graph
    light = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        if proto.HasField(field):
            setattr(light, field, getattr(proto, field))
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    lg = light.graph
    lg.name = g.name
    lg.node.extend(g.node)
    lg.input.extend(g.input)
    lg.output.extend(g.output)
    lg.value_info.extend(g.value_info)
    lg.sparse_initializer.extend(g.sparse_initializer)
    inputs = {vi.name for vi in g.input}
    for t in g.initializer:
        if _nbytes(t) <= LARGE_BYTES:
            lg.initializer.append(t)
        elif t.name not in inputs:
            lg.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def _nbytes(t: onnx.TensorProto) -> int:
    """A tensor's data size from its dims and type, without touching the data (protobuf's ByteSize serializes the
    message to count it: 0.4 s over BERT-base's weights); ByteSize for strings and unknown types."""
    if t.data_type == onnx.TensorProto.STRING:
        return t.ByteSize()
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return t.ByteSize()
    return math.prod(t.dims) * itemsize


def adopt_shapes(proto: onnx.ModelProto, inferred: onnx.ModelProto) -> None:
    """Give `proto` what shape inference found on its weightless copy: the intermediates' types, the outputs', and
    the nodes (their subgraphs carry inferred types too)."""
    g, i = proto.graph, inferred.graph
    del g.value_info[:]
    g.value_info.extend(i.value_info)
    del g.output[:]
    g.output.extend(i.output)
    del g.node[:]
    g.node.extend(i.node)
