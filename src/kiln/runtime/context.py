"""An execution context: runs an engine's layers on its device, one context per thread or stream."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from kiln.errors import InputError, InternalError, KilnError
from kiln.ir.dtype import to_numpy
from kiln.kinds import run_reference
from kiln.runtime.io import check_feeds


class ExecutionContext:
    """Holds per-run state; the engine's weights are shared between contexts."""

    def __init__(self, engine):
        self.engine = engine
        self._steps = [(layer, run_reference, [i or None for i in layer.inputs]) for layer in engine.network.layers]

    def run(self, feeds: Mapping[str, Any], *, keep: set[str] | None = None) -> dict[str, Any]:
        """Run the engine. numpy in → numpy out; torch or DLPack in → torch out (on the engine's device).

        `keep` names extra intermediate tensors to return as well (for debugging and `compare --mark-all`).
        """
        engine = self.engine
        net = engine.network
        tensors, as_numpy = check_feeds(feeds, [net.tensors[n] for n in net.inputs], engine.config.profiles)
        dev = engine.device.torch_device
        values: dict[str, torch.Tensor] = dict(engine.weights)
        for k, v in tensors.items():
            values[k] = v.to(dev, non_blocking=True) if v.device.type != dev else v
        keep = set(keep or ())
        release = engine.memory_plan.release
        with torch.inference_mode():
            for step, (layer, ref, names) in enumerate(self._steps):
                try:
                    outs = ref(layer.kind, [values[n] if n else None for n in names], layer.attrs)
                except KilnError:
                    raise
                except (RuntimeError, ValueError, IndexError) as e:
                    if engine.has_dynamic_inputs:
                        raise InputError(f"layer {layer.name!r} ({layer.kind}) failed on these input shapes: "
                                         f"{str(e).splitlines()[0]}; check the shapes agree with each other") from e
                    raise InternalError(f"layer {layer.name!r} ({layer.kind}) failed: {e}") from e
                for name, value in zip(layer.outputs, outs):
                    if name:
                        values[name] = value
                for name in release[step]:
                    if name not in keep:
                        values.pop(name, None)
        result = {n: values[n] for n in list(net.outputs) + sorted(keep - set(net.outputs))}
        if as_numpy:
            return {n: to_numpy(v) for n, v in result.items()}
        return result
