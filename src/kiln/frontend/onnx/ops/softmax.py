"""ONNX importers for Softmax, LogSoftmax and Hardmax.

Before opset 13 these coerce the input to 2-D at `axis` (default 1); from 13 on they work along
the one dim `axis` (default -1).
"""

from __future__ import annotations

from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register

OPS = ("Softmax", "LogSoftmax", "Hardmax")


def _legacy(node: OnnxNode, ctx: ImportContext) -> None:
    direct(node.op_type, node, ctx).attrs["flatten"] = True


def _current(node: OnnxNode, ctx: ImportContext) -> None:
    direct(node.op_type, node, ctx).attrs["flatten"] = False


for _op in OPS:
    register(_op, since=1)(_legacy)
    register(_op, since=13)(_current)
