"""ONNX frontend: safe loading and validation, then import through the op registry."""

from kiln.frontend.onnx.importer import import_onnx
from kiln.frontend.onnx.loader import LoadedModel, load_onnx

__all__ = ["LoadedModel", "import_onnx", "load_onnx"]
