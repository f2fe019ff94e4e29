"""ONNX importers for activation ops."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register, register_direct

register_direct("Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "HardSigmoid", "Sigmoid", "Tanh", "Softplus",
                "Softsign", since=1)
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
