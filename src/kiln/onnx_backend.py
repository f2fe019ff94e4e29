"""kiln as an `onnx.backend.base.Backend`, so that ONNX's own conformance harness runs against it unchanged.

    import kiln.onnx_backend as backend
    globals().update(onnx.backend.test.BackendTest(backend, __name__).test_cases)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch
from onnx.backend.base import Backend, BackendRep

import kiln
from kiln.ir.dtype import to_numpy

_DEVICES = {"CPU": "cpu", "CUDA": "cuda"}


class KilnRep(BackendRep):
    """A built kiln engine that takes inputs positionally, as the ONNX harness passes them."""

    def __init__(self, engine: kiln.Engine):
        self.engine = engine
        self.context = engine.create_context()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = [t.name for t in self.engine.inputs]
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        out = self.context.run(feeds)
        return tuple(_to_numpy(out[t.name]) for t in self.engine.outputs)


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return to_numpy(value)
    if isinstance(value, (list, tuple)):
        return [_to_numpy(v) for v in value]
    return value


class KilnBackend(Backend):
    """Builds a kiln engine for the requested device from a ModelProto."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> KilnRep:
        config = kiln.BuildConfig(device=_DEVICES[device.split(":")[0].upper()])
        return KilnRep(kiln.build(model, config))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = device.split(":")[0].upper()
        return kind == "CPU" or (kind == "CUDA" and torch.cuda.is_available())


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
supports_device = KilnBackend.supports_device
is_compatible = KilnBackend.is_compatible
