"""ONNX importers for the control-flow ops If, Loop and Scan: bodies become nested Networks.

`ctx` here is the importer's GraphContext: `ctx.bodies` imports the bodies and returns the
enclosing values they capture, which the layer takes as its last inputs.
"""

from __future__ import annotations

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, schema_defaults
from kiln.ir import DType


def loose_type(ctx: ImportContext, name: str):
    """The type of `name` with its shape left unknown: carried values may change shape between iterations."""
    t = ctx.network.tensors.get(name) if name else None
    return None if t is None else (t.dtype, None, t.kind)


def body_types(body, names: list[str]) -> list:
    """Types of `names` in a body, as fallbacks for the layer's outputs."""
    return [(t.dtype, t.shape, t.kind) for t in (body.tensors[n] for n in names)]


@register("If", since=1)
def if_(node: OnnxNode, ctx: ImportContext) -> None:
    (then_net, else_net), captures = ctx.bodies(node, [(node.attrs["then_branch"].g, []),
                                                       (node.attrs["else_branch"].g, [])])
    ctx.type_missing(node.outputs, body_types(then_net, then_net.outputs))
    ctx.emit(node, "If", [node.inputs[0], *captures], node.outputs,
             {"then_branch": then_net, "else_branch": else_net})


@register("Loop", since=1)
def loop(node: OnnxNode, ctx: ImportContext) -> None:
    inputs = node.inputs + [""] * (2 - len(node.inputs))
    if not inputs[0] and not inputs[1]:
        raise UnsupportedOpError(f"{node.where()}: a Loop with neither a trip count M nor a condition never "
                                 "ends; give it one of them")
    carried = inputs[2:]
    fallback = [(DType.INT64, (), "tensor"), (DType.BOOL, (), "tensor")] + [loose_type(ctx, v) for v in carried]
    (body,), captures = ctx.bodies(node, [(node.attrs["body"].g, fallback)])
    n = len(carried)
    scans = [(t[0], (None, *t[1]) if t[1] is not None else None, "tensor")
             for t in body_types(body, body.outputs[1 + n:])]
    ctx.type_missing(node.outputs, [loose_type(ctx, v) for v in carried] + scans)
    ctx.emit(node, "Loop", [*inputs, *captures], node.outputs, {"body": body, "captures": len(captures)})


def _scan_attr(node: OnnxNode, attrs: dict, name: str, count: int, allowed=None) -> list[int]:
    values = list(attrs.get(name) or [0] * count)
    if len(values) != count or (allowed and any(v not in allowed for v in values)):
        raise ModelError(f"{node.where()}: attribute {name}={values} must have {count} entries"
                         + (f" from {sorted(allowed)}" if allowed else ""))
    return values


def _scan(node: OnnxNode, ctx: ImportContext, inputs: list[str], attrs: dict, batched: bool) -> None:
    m = attrs["num_scan_inputs"]
    n, outs = len(inputs) - m, len(node.outputs)
    if not 0 < m <= len(inputs) or outs < n:
        raise ModelError(f"{node.where()}: num_scan_inputs={m} does not fit {len(inputs)} inputs and {outs} outputs")
    fallback = [loose_type(ctx, v) for v in inputs]
    (body,), captures = ctx.bodies(node, [(node.attrs["body"].g, fallback)])
    ctx.type_missing(node.outputs, [loose_type(ctx, v) for v in inputs[:n]] + [None] * (outs - n))
    ctx.emit(node, "Scan", [*inputs, *captures], node.outputs, {
        "body": body, "captures": len(captures), "num_scan_inputs": m, "batched": batched,
        "scan_input_axes": _scan_attr(node, attrs, "scan_input_axes", m),
        "scan_input_directions": _scan_attr(node, attrs, "scan_input_directions", m, {0, 1}),
        "scan_output_axes": _scan_attr(node, attrs, "scan_output_axes", outs - n),
        "scan_output_directions": _scan_attr(node, attrs, "scan_output_directions", outs - n, {0, 1})})


@register("Scan", since=8)
def scan8(node: OnnxNode, ctx: ImportContext) -> None:
    """Opset 8: axis 0 is a batch axis, scanned along axis 1; `directions` is per scan input."""
    if node.inputs[0]:
        raise UnsupportedOpError(f"{node.where()}: Scan-8 sequence_lens (input {node.inputs[0]!r}) is not "
                                 "supported; omit it or export with opset >= 9")
    attrs = schema_defaults(node) | node.attrs
    attrs["scan_input_directions"] = attrs.pop("directions", None)
    _scan(node, ctx, node.inputs[1:], attrs, batched=True)


@register("Scan", since=9)
def scan(node: OnnxNode, ctx: ImportContext) -> None:
    _scan(node, ctx, node.inputs, schema_defaults(node) | node.attrs, batched=False)
