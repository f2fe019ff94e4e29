"""ONNX importers for the strings op family."""

from __future__ import annotations

from kiln.frontend.onnx.registry import register, register_direct
