"""kiln: an inference optimizer that turns ONNX models into fast engines for the device at hand."""

from kiln.builder import build
from kiln.config import BuildConfig, ShapeRange
from kiln.engine import Engine
from kiln.errors import (ConfigError, EngineCompatibilityError, InputError, InternalError, KilnError, ModelError,
                         PlanError, UnsupportedOpError)
from kiln.version import __version__


def load(path, policy: str = "strict", *, verify_key=None, timing_cache=None) -> Engine:
    """Load a plan file. `policy`: 'strict' (refuse another GPU model or software versions, naming each
    difference), 'warn' (run, saying what differs) or 'retune' (re-tune for this device, using and filling
    `timing_cache`). With `verify_key` (a PEM public key file), a plan without a valid signature is refused."""
    return Engine.load(path, policy, verify_key=verify_key, timing_cache=timing_cache)


__all__ = ["BuildConfig", "ConfigError", "Engine", "EngineCompatibilityError", "InputError", "InternalError",
           "KilnError", "ModelError", "PlanError", "ShapeRange", "UnsupportedOpError", "__version__", "build", "load"]
