"""The compute floor of a model: FLOPs counted from its ONNX graph, divided by a measured matmul rate."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from kiln.bench import measure
from kiln.frontend.onnx.loader import set_input_shapes

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
SMALL = 100_000  # elements: constants up to this size are kept and folded; larger ones only contribute shapes
Shapes = dict[str, tuple[int, ...]]


@dataclass
class FlopCount:
    """2 × multiply-adds of the model's Conv / MatMul / Gemm nodes; nodes whose shapes stayed unknown are listed."""

    flops: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted: list[str] = field(default_factory=list)


def _skeleton(proto: onnx.ModelProto, input_shapes: Shapes) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The graph with its large initializers turned into shaped inputs (cheap to re-infer) and its small constants."""
    g = proto.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer if math.prod(t.dims) <= SMALL}
    big = [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
           for t in g.initializer if t.name not in consts]
    graph = onnx.helper.make_graph(list(g.node), g.name, list(g.input) + big, [onnx.ValueInfoProto(name=o.name)
                                                                              for o in g.output])
    skeleton = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    set_input_shapes(skeleton, input_shapes)
    return skeleton, consts


def _infer(skeleton: onnx.ModelProto, consts: dict[str, np.ndarray]) -> dict[str, tuple[int, ...] | None]:
    """Every tensor's shape by ONNX shape inference with the folded constants as initializers; None if not static."""
    m = onnx.ModelProto.FromString(skeleton.SerializeToString())
    m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    shapes: dict[str, tuple[int, ...] | None] = {k: v.shape for k, v in consts.items()}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
        known = dims is not None and all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims)
        shapes.setdefault(vi.name, tuple(d.dim_value for d in dims) if known else None)
    return shapes


def _fold(node: onnx.NodeProto, shapes: dict, consts: dict[str, np.ndarray], opsets: dict) -> list | None:
    """The outputs of a node computable now (Shape of a static tensor, or small constants in), else None."""
    if node.op_type == "Shape" and shapes.get(node.input[0]) is not None:
        attrs = {a.name: a.i for a in node.attribute}
        return [np.array(shapes[node.input[0]][attrs.get("start", 0):attrs.get("end")], dtype=np.int64)]
    ins = [n for n in node.input if n]
    if (not ins and node.op_type != "Constant") or not all(n in consts for n in ins) or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None
    return ReferenceEvaluator(node, opsets=opsets).run(None, {n: consts[n] for n in ins})


def static_shapes(proto: onnx.ModelProto, input_shapes: Shapes) -> dict[str, tuple[int, ...] | None]:
    """Shape inference with shape arithmetic folded: ONNX's own inference stops at Shape→Gather→Reshape chains."""
    skeleton, consts = _skeleton(proto, input_shapes)
    opsets = {o.domain: o.version for o in proto.opset_import}
    while True:
        shapes, grew = _infer(skeleton, consts), False
        for node in skeleton.graph.node:
            if all(o in consts for o in node.output if o):
                continue
            outs = _fold(node, shapes, consts, opsets)
            for name, value in zip(node.output, outs or ()):
                if name and np.asarray(value).size <= SMALL:
                    consts[name], shapes[name], grew = np.asarray(value), np.shape(value), True
        if not grew:
            return shapes


def _node_flops(node: onnx.NodeProto, shapes: dict) -> int | None:
    """2 × multiply-adds of one Conv, MatMul or Gemm node; None when a shape it needs is unknown."""
    ins = [shapes.get(n) for n in node.input[:2]]
    out = shapes.get(node.output[0])
    if out is None or any(s is None for s in ins):
        return None
    if node.op_type == "Conv":  # each output element: a dot product over Cin/group × kernel
        return 2 * math.prod(out) * math.prod(ins[1][1:])
    if node.op_type == "MatMul":  # each output element: a dot product over A's last dim
        return 2 * math.prod(out) * ins[0][-1]
    trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
    return 2 * math.prod(out) * ins[0][0 if trans_a else 1]  # Gemm


def count_flops(model: str | Path | onnx.ModelProto, input_shapes: Shapes) -> FlopCount:
    """FLOPs of one inference with the inputs fixed to `input_shapes`."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    shapes, count = static_shapes(proto, input_shapes), FlopCount()
    for i, node in enumerate(proto.graph.node):
        if node.op_type not in ("Conv", "MatMul", "Gemm"):
            continue
        flops = _node_flops(node, shapes)
        if flops is None:
            count.uncounted.append(node.name or f"{node.op_type}_{i}")
            continue
        count.flops += flops
        count.by_op[node.op_type] = count.by_op.get(node.op_type, 0) + flops
    return count


def matmul_rate(device: str, precision: str, quick: bool = False) -> float:
    """Measured FLOP/s of one large square torch.matmul in `precision` on `device` (median of timed calls)."""
    n = 8192 if device == "cuda" else 512
    a, b = (torch.randn(n, n, device=device, dtype=DTYPES[precision]) for _ in range(2))
    stats = measure(lambda: torch.matmul(a, b), device=device, warmup=3 if quick else 10,
                    iterations=5 if quick else 30)
    return 2 * n**3 / (stats.median / 1e3)
