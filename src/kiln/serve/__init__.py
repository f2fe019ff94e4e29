"""kiln serve: a KServe v2 / Triton-compatible inference server over kiln engines (see docs/serve-interface.md)."""

from __future__ import annotations

import importlib

INLINE_US = 1000  # default of kiln serve --inline-us (DynamicBatcher.inline_s): here, so the CLI reads it without torch

_EXPORTS = {
    "ServeError": "errors", "BadRequest": "errors", "ModelNotFound": "errors", "ModelNotReady": "errors",
    "QueueFull": "errors", "RequestTimeout": "errors", "TooLarge": "errors",
    "V2_TO_NUMPY": "dtypes", "numpy_to_v2": "dtypes",
    "TensorConfig": "config", "DynamicBatching": "config", "ModelConfig": "config",
    "ModelRepository": "repository", "ServedModel": "model", "DynamicBatcher": "batcher", "Metrics": "metrics",
}


def __getattr__(name: str):
    """Import the public names on first use, so `import kiln.serve` stays light."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = sorted(_EXPORTS)
