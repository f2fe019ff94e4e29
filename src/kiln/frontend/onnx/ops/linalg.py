"""ONNX importers for linear-algebra ops."""

from __future__ import annotations

from kiln.frontend.onnx.registry import register_direct

register_direct("Einsum", since=12)
register_direct("Det", since=11)
