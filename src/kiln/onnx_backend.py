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
from kiln.errors import ConfigError, InputError, ModelError
from kiln.ir.dtype import to_numpy

_DEVICES = {"CPU": "cpu", "CUDA": "cuda"}


class KilnRep(BackendRep):
    """A built kiln engine that takes inputs positionally, as the ONNX harness passes them."""

    def __init__(self, engine: kiln.Engine):
        self.engine = engine
        self.context = engine.create_context()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        out = self.context.run(_feeds(inputs, [t.name for t in self.engine.inputs]))
        return tuple(_to_numpy(out[t.name]) for t in self.engine.outputs)


def _feeds(inputs: Any, names: list[str]) -> dict[str, Any]:
    """`inputs` (a dict by name, one array, or a list of them in the order of `names`) as a dict by name."""
    if isinstance(inputs, dict):
        return dict(inputs)
    if isinstance(inputs, (np.ndarray, torch.Tensor)):
        inputs = [inputs]
    if not isinstance(inputs, (list, tuple)):
        raise InputError(f"inputs must be a list of arrays in the order {names}, or a dict by name; "
                         f"got {type(inputs).__name__}")
    if len(inputs) > len(names):
        raise InputError(f"{len(inputs)} inputs given, but the model takes {len(names)}: {names}")
    return dict(zip(names, inputs))


def _device(device: Any) -> str:
    """ONNX's device string ('CPU', 'CUDA', 'CUDA:0') as kiln's device name."""
    kind = device.split(":")[0].upper() if isinstance(device, str) else None
    if kind not in _DEVICES:
        raise ConfigError(f"device {device!r} is not one kiln runs on; use 'CPU' or 'CUDA'")
    return _DEVICES[kind]


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
        return KilnRep(kiln.build(model, kiln.BuildConfig(device=_device(device))))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info: Any = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node on `inputs` (arrays in the order of its inputs, or a dict by name) as a one-node model at
        `opset_version` (default: the newest this onnx knows)."""
        if not isinstance(node, onnx.NodeProto):
            raise ConfigError(f"run_node: node must be an onnx.NodeProto, got {type(node).__name__}")
        feeds = {k: np.asarray(v) for k, v in _feeds(inputs, [n for n in node.input if n]).items()}
        graph = onnx.helper.make_graph(
            [node], f"run_node_{node.op_type}",
            [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in feeds.items()],
            [onnx.ValueInfoProto(name=n) for n in node.output if n])
        opsets = {"": kwargs.get("opset_version", onnx.defs.onnx_opset_version())}
        ctx = onnx.checker.C.CheckerContext()
        try:  # the node itself, then the outputs' types, which the one-node model must declare
            if node.domain:
                opsets[node.domain] = onnx.defs.get_schema(node.op_type, domain=node.domain).since_version
            ctx.ir_version, ctx.opset_imports = onnx.IR_VERSION, opsets
            onnx.checker.check_node(node, ctx)
            model = onnx.shape_inference.infer_shapes(onnx.helper.make_model(
                graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()]), strict_mode=True)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, onnx.defs.SchemaError) as e:
            raise ModelError(f"node {node.name or node.op_type!r} ({node.op_type}) is not valid for these inputs: "
                             f"{str(e).strip().splitlines()[0]}") from None
        return cls.prepare(model, device).run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if not isinstance(device, str):
            return False
        kind = device.split(":")[0].upper()
        return kind == "CPU" or (kind == "CUDA" and torch.cuda.is_available())


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
supports_device = KilnBackend.supports_device
run_node = KilnBackend.run_node
is_compatible = KilnBackend.is_compatible
