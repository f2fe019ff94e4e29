"""ONNX importers for the ai.onnx.preview.training optimizers (Momentum, Adagrad, Adam)."""

from __future__ import annotations

from kiln.errors import UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register, register_direct

DOMAIN = "ai.onnx.preview.training"
MODES = ("standard", "nesterov")


@register("Momentum", since=1, domain=DOMAIN)
def momentum(node: OnnxNode, ctx: ImportContext) -> None:
    if node.attr("mode") not in MODES:
        raise UnsupportedOpError(f"{node.where()}: mode={node.attr('mode')!r} is not supported; use one of {MODES}")
    direct("Momentum", node, ctx)


register_direct("Adagrad", "Adam", since=1, domain=DOMAIN)
