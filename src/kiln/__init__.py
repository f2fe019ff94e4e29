"""kiln: an inference optimizer that turns ONNX models into fast engines for the device at hand."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kiln.config import BuildConfig, ShapeRange
from kiln.errors import (ConfigError, EngineCompatibilityError, InputError, InternalError, KilnError, ModelError,
                         PlanError, UnsupportedOpError)
from kiln.version import __version__

if TYPE_CHECKING:
    from kiln.runtime import Engine
    from kiln.session import InferenceSession


def __getattr__(name: str):
    """`kiln.Engine` and kiln's subpackages, imported on first use: `import kiln` (and `kiln --help`) stays light,
    without torch."""
    if name == "Engine":
        from kiln.runtime import Engine

        return Engine
    if name == "InferenceSession":
        from kiln.session import InferenceSession

        return InferenceSession
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build(model, config: BuildConfig | None = None, progress=None, calib_data=None, validation_data=None,
          base_dir=None) -> Engine:
    """Build an engine for the best device present (or `config.device`) from an ONNX model: a path, its bytes or an
    onnx.ModelProto. `progress(stage, done, total)` is called as the build goes; `calib_data` / `validation_data`
    feed --int8/--fp8 calibration and the accuracy budget; `base_dir`: the folder holding the external data of a
    model given as bytes or a ModelProto."""
    from kiln.runtime import Engine

    return Engine.build(model, config, progress, calib_data, validation_data, base_dir)


def load(path, policy: str = "strict", *, verify_key=None, timing_cache=None) -> Engine:
    """Load a plan file. `policy`: 'strict' (refuse another GPU model or software versions, naming each
    difference), 'warn' (run, saying what differs) or 'retune' (re-tune for this device, using and filling
    `timing_cache`). With `verify_key` (a PEM public key file), a plan without a valid signature is refused. A plan
    that uses plugin ops needs them registered first (import the plugin, or `kiln.plugins.load_plugin(file)`): kiln
    never imports a module a plan names."""
    from kiln.runtime import Engine

    return Engine.load(path, policy, verify_key=verify_key, timing_cache=timing_cache)


__all__ = ["BuildConfig", "ConfigError", "Engine", "EngineCompatibilityError", "InferenceSession", "InputError",
           "InternalError", "KilnError", "ModelError", "PlanError", "ShapeRange", "UnsupportedOpError", "__version__",
           "build", "compile", "load"]
