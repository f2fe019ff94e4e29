"""ONNX `Constant`: becomes a network constant, not a layer."""

from __future__ import annotations

import torch

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register


@register("Constant", since=1)
def constant(node: OnnxNode, ctx: ImportContext) -> None:
    a = node.attrs
    if "value" in a and isinstance(a["value"], torch.Tensor):
        value = a["value"]
    elif "value_float" in a:
        value = torch.tensor(a["value_float"], dtype=torch.float32)
    elif "value_floats" in a:
        value = torch.tensor(a["value_floats"], dtype=torch.float32)
    elif "value_int" in a:
        value = torch.tensor(a["value_int"], dtype=torch.int64)
    elif "value_ints" in a:
        value = torch.tensor(a["value_ints"], dtype=torch.int64)
    else:
        raise UnsupportedOpError(f"{node.where()}: only numeric dense constants are supported "
                                 f"(got attributes {sorted(a)})")
    ctx.network.tensors.pop(node.outputs[0], None)
    ctx.network.add_constant(node.outputs[0], value)
