"""kiln: an inference optimizer that turns ONNX models into fast engines for the device at hand."""

from kiln.builder import build
from kiln.config import BuildConfig, ShapeRange
from kiln.engine import Engine
from kiln.errors import (ConfigError, EngineCompatibilityError, InputError, InternalError, KilnError, ModelError,
                         PlanError, UnsupportedOpError)
from kiln.version import __version__


def load(path, policy: str = "strict") -> Engine:
    """Load a plan file; `policy` is 'strict' (refuse another device/versions) or 'warn'."""
    return Engine.load(path, policy)


__all__ = ["BuildConfig", "ConfigError", "Engine", "EngineCompatibilityError", "InputError", "InternalError",
           "KilnError", "ModelError", "PlanError", "ShapeRange", "UnsupportedOpError", "__version__", "build", "load"]
