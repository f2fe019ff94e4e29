"""ONNX importers for the random ops: RandomUniform/Normal(+Like), Bernoulli, Multinomial.

Every layer gets its output type as a `DType` attribute (the schema's type constraints are checked
by ONNX inference at load); RandomUniform/RandomNormal get their `shape` attribute as a constant
input, so that the layer knows the device it runs on.
"""

from __future__ import annotations

import torch

from kiln.frontend.onnx.registry import ImportContext, OnnxNode, dtype_of, register, schema_defaults
from kiln.ir import DType


def _attrs(node: OnnxNode, ctx: ImportContext) -> dict:
    """Defaults + the node's attributes, with `dtype` resolved (absent: the input's type) and `seed` present."""
    attrs = schema_defaults(node) | node.attrs
    code = attrs.get("dtype")
    attrs["dtype"] = DType.from_onnx(code) if code is not None else dtype_of(ctx, node.inputs[0])
    attrs.setdefault("seed", None)
    return attrs


def _from_shape(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = _attrs(node, ctx)
    shape = ctx.add_constant(f"{node.name}_shape", torch.tensor(attrs.pop("shape"), dtype=torch.int64))
    ctx.emit(node, node.op_type, [shape], node.outputs, attrs)


def _same_inputs(node: OnnxNode, ctx: ImportContext) -> None:
    ctx.emit(node, node.op_type, node.inputs, node.outputs, _attrs(node, ctx))


for _op in ("RandomUniform", "RandomNormal"):
    register(_op, since=1)(_from_shape)
for _op in ("RandomUniformLike", "RandomNormalLike"):
    register(_op, since=1)(_same_inputs)
register("Bernoulli", since=15)(_same_inputs)
register("Multinomial", since=7)(_same_inputs)
