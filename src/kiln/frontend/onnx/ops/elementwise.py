"""ONNX importers for elementwise arithmetic, comparison and logic ops."""

from __future__ import annotations

from kiln.frontend.onnx.registry import register_direct

register_direct("Add", "Sub", "Mul", "Div", since=7)
register_direct("Equal", "Less", "Greater", "And", "Or", "Xor", since=7)
register_direct("LessOrEqual", "GreaterOrEqual", since=12)
