"""Plugins: supply an ONNX op kiln does not know, as a reference implementation plus a type rule.

    kiln.plugins.register_op("MyOp", my_ref, domain="com.example")

The op then imports as a layer of its own kind and runs wherever its torch reference runs.
"""

from __future__ import annotations

from typing import Callable

from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register
from kiln.ir import DType
from kiln.kinds.registry import KINDS, Reference, kind

TypeRule = Callable[[list[tuple[DType, tuple | None]], dict], list[tuple[DType, tuple | None]]]


def same_as_first_input(types, attrs):
    """Default type rule: every output has the first input's dtype and shape."""
    return [types[0]]


def register_op(op_type: str, reference: Reference, *, domain: str = "", since: int = 1,
                types: TypeRule = same_as_first_input) -> str:
    """Register `op_type` of `domain`; returns the layer kind's name. `types` gives output (dtype, shape)s."""
    name = f"{domain}::{op_type}" if domain else op_type
    if name not in KINDS:
        kind(name)(reference)

    @register(op_type, since=since, domain=domain)
    def _import(node: OnnxNode, ctx: ImportContext) -> None:
        net = ctx.network
        in_types = [(net.tensors[i].dtype, net.tensors[i].shape) if i else None for i in node.inputs]
        ctx.emit(node, name, node.inputs, node.outputs, node.attrs)
        for out, (dtype, shape) in zip(node.outputs, types(in_types, node.attrs)):
            if out and out not in net.tensors:
                net.add_tensor(out, dtype, shape)

    return name
