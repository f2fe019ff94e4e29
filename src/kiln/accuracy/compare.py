"""kiln against ONNX Runtime on the same inputs: per output, and with `every_tensor` per intermediate tensor."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx

from kiln.accuracy.metrics import Metrics, Tolerance, compare_arrays
from kiln.errors import ConfigError, ModelError
from kiln.ir import Network


@dataclass
class Comparison:
    """Per-tensor metrics; `first_bad` is (layer, tensor) where the error first exceeds tolerance, in run order."""

    outputs: dict[str, Metrics]
    tolerances: dict[str, Tolerance]
    intermediates: dict[str, Metrics] = field(default_factory=dict)
    first_bad: tuple[str, str] | None = None

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.outputs.values())


def run_ort(model: Path, feeds: Mapping[str, np.ndarray], every_tensor: bool = False) -> dict[str, Any]:
    """The model's outputs from ONNX Runtime on the CPU; with `every_tensor`, every top-level node output too."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ConfigError("compare needs ONNX Runtime as its reference; install it with pip install onnxruntime"
                          ) from None
    proto = onnx.load(str(model))
    if every_tensor:
        expose_all(proto)
    try:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, dict(feeds))))
    except Exception as e:  # ORT's own exception types: the reference could not run, not a kiln bug
        raise ModelError(f"ONNX Runtime could not run {model.name}: {' '.join(str(e).split())}") from None


def expose_all(proto: onnx.ModelProto) -> None:
    """Make every node output of the main graph a graph output (ORT infers their types), in place."""
    graph = proto.graph
    present = {o.name for o in graph.output}
    for node in graph.node:
        for name in node.output:
            if name and name not in present:
                graph.output.append(onnx.ValueInfoProto(name=name))
                present.add(name)


def flatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """Sequence values (lists) as one entry per element, `name[i]`; None (an empty optional) dropped."""
    out = {}
    for name, value in values.items():
        if isinstance(value, list):
            out.update({f"{name}[{i}]": v for i, v in enumerate(value)})
        elif value is not None:
            out[name] = value
    return out


def compare_values(ref: Mapping[str, Any], got: Mapping[str, Any], tol_of) -> dict[str, Metrics]:
    """Metrics of every (flattened) value of `got` that `ref` also has; `tol_of(name)` gives its tolerance."""
    ref, got = flatten(ref), flatten(got)
    return {n: compare_arrays(ref[n], v, tol_of(n)) for n, v in got.items() if n in ref}


def first_bad_layer(net: Network, metrics: Mapping[str, Metrics]) -> tuple[str, str] | None:
    """(layer, tensor) of the first layer in run order with an output beyond tolerance."""
    for layer in net.layers:
        for name in layer.outputs:
            if name in metrics and not metrics[name].passed:
                return layer.name, name
    return None


def layer_outputs(net: Network) -> set[str]:
    """Every tensor a layer of `net` writes: what `ctx.run(keep=...)` can return."""
    return {o for layer in net.layers for o in layer.outputs if o}


def compare_engine(engine, model: Path, feeds: Mapping[str, np.ndarray], default: Tolerance,
                   per_output: Mapping[str, Tolerance], every_tensor: bool = False) -> Comparison:
    """Run `engine` and ONNX Runtime on `feeds` and compare outputs (and intermediates with `every_tensor`)."""
    unknown = sorted(set(per_output) - set(engine.network.outputs))
    if unknown:
        raise ConfigError(f"--tol names {unknown}, but the model's outputs are {engine.network.outputs}")
    ref = run_ort(model, feeds, every_tensor)
    outputs = set(engine.network.outputs)
    keep = (layer_outputs(engine.network) & set(ref)) - outputs if every_tensor else set()
    got = engine.create_context().run(feeds, keep=keep)
    tol_of = lambda name: per_output.get(name.partition("[")[0], default)  # noqa: E731
    metrics = compare_values(ref, {n: got[n] for n in engine.network.outputs}, tol_of)
    result = Comparison(metrics, {n: tol_of(n) for n in metrics})
    if every_tensor:
        result.intermediates = compare_values(ref, {n: got[n] for n in sorted(keep)}, lambda n: default)
        result.first_bad = first_bad_layer(engine.network, {**result.intermediates, **result.outputs})
    return result


def compare_outputs(ref: Mapping[str, Any], got: Mapping[str, Any], default: Tolerance,
                    per_output: Mapping[str, Tolerance], what: str) -> Comparison:
    """`got` (an engine's outputs) against `ref` (another plan's, or outputs saved earlier, named by `what`)."""
    unknown = sorted(set(per_output) - {n.partition("[")[0] for n in got})
    if unknown:
        raise ConfigError(f"--tol names {unknown}, but the outputs are {sorted(got)}")
    missing = sorted(set(flatten(got)) - set(flatten(ref)))
    if missing:
        raise ConfigError(f"{what} has no outputs {missing[:10]}; it holds {sorted(flatten(ref))[:10]}")
    tol_of = lambda name: per_output.get(name.partition("[")[0], default)  # noqa: E731
    metrics = compare_values(ref, got, tol_of)
    return Comparison(metrics, {n: tol_of(n) for n in metrics})
