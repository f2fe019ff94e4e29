"""ONNX importers for activation ops."""

from __future__ import annotations

from kiln.frontend.onnx.registry import register_direct

register_direct("Relu", since=6)
