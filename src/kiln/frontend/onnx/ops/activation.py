"""ONNX importers for activation ops."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register, register_direct

register_direct("Relu", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "Sigmoid", "Tanh", "Softplus",
                "Softsign", since=1)
register_direct("PRelu", since=7)
register_direct("Shrink", since=9)
register_direct("ThresholdedRelu", since=10)
register_direct("Celu", since=12)
register_direct("HardSwish", since=14)
register_direct("Mish", since=18)
register_direct("Swish", since=24)


@register("Gelu", since=20)
def gelu(node: OnnxNode, ctx: ImportContext) -> None:
    if node.attr("approximate", "none") not in ("none", "tanh"):
        raise UnsupportedOpError(f"{node.where()}: approximate={node.attr('approximate')!r} is not one of "
                                 "'none', 'tanh'")
    direct("Gelu", node, ctx)


@register("PRelu", since=1)
def prelu_legacy(node: OnnxNode, ctx: ImportContext) -> None:
    """Opset < 7: a 1-D slope of C values applies along axis 1 (channels), not the last axis."""
    x_rank = len(ctx.network.tensors[node.inputs[0]].shape or ())
    slope = ctx.require_constant(node, node.inputs[1], "the slope of a PRelu before opset 7")
    if slope.dim() == 1 and slope.numel() > 1 and x_rank > 2:
        name = ctx.add_constant(node.inputs[1] + "_channels", slope.reshape(-1, *[1] * (x_rank - 2)))
        ctx.emit(node, "PRelu", [node.inputs[0], name], node.outputs)
    else:
        ctx.emit(node, "PRelu", node.inputs, node.outputs)
