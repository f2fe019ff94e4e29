"""Network ⇄ JSON manifest + named tensors, with no code and no pickle.

Control-flow bodies (Network attributes) nest as JSON manifests inside the layer's attributes,
their tensors stored under a path prefix (net/<layer>/<attribute>/); nesting is capped on load.
String constants (numpy object arrays) are stored in the manifest as JSON lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kiln.errors import InternalError, PlanError
from kiln.frontend.onnx.limits import ModelLimits
from kiln.ir import DType, Layer, Network

_TENSOR_KEY = "$tensor"
MAX_DEPTH = ModelLimits().max_graph_depth


def network_to_json(net: Network, prefix: str = "") -> tuple[dict, dict[str, torch.Tensor]]:
    """(manifest dict, tensors to store); attribute tensors are stored beside the constants."""
    tensors: dict[str, torch.Tensor] = {f"{prefix}const/{k}": v.contiguous() for k, v in net.constants.items()
                                        if isinstance(v, torch.Tensor)}

    def enc(layer: Layer, key: str, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            name = f"{prefix}attr/{layer.name}/{key}"
            tensors[name] = v.contiguous()
            return {_TENSOR_KEY: name}
        if isinstance(v, Network):
            sub, sub_tensors = network_to_json(v, f"{prefix}net/{layer.name}/{key}/")
            tensors.update(sub_tensors)
            return {"$network": sub}
        if isinstance(v, (list, tuple)):
            return [enc(layer, key, x) for x in v]
        if isinstance(v, DType):
            return {"$dtype": v.value}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise PlanError(f"layer {layer.name!r}: attribute {key!r} of type {type(v).__name__} cannot be saved")

    manifest = {
        "name": net.name,
        "inputs": net.inputs,
        "outputs": net.outputs,
        "tensors": [{"name": t.name, "dtype": t.dtype.value, "kind": t.kind,
                     "shape": None if t.shape is None else list(t.shape)} for t in net.tensors.values()],
        "constants": [k for k, v in net.constants.items() if isinstance(v, torch.Tensor)],
        "strings": {k: {"shape": list(v.shape), "values": [str(s) for s in v.flat]}
                    for k, v in net.constants.items() if not isinstance(v, torch.Tensor)},
        "layers": [{"name": l.name, "kind": l.kind, "inputs": l.inputs, "outputs": l.outputs,
                    "attrs": {k: enc(l, k, v) for k, v in l.attrs.items()},
                    "precision": l.precision.value if l.precision else None, "origin": l.origin}
                   for l in net.layers],
    }
    return manifest, tensors


def network_from_json(m: dict, tensors: dict[str, torch.Tensor]) -> Network:
    """Rebuild a network from an untrusted manifest; any malformation is a PlanError."""
    try:
        net = _network(m, tensors, "", 0)
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, InternalError, RecursionError) as e:
        raise PlanError(f"plan manifest is malformed ({type(e).__name__}: {e}); rebuild the plan") from None
    try:
        net.verify()
    except Exception as e:
        raise PlanError(f"plan network is inconsistent ({e}); rebuild the plan") from None
    return net


def _network(m: dict, tensors: dict[str, torch.Tensor], prefix: str, depth: int) -> Network:
    from kiln.kinds import KINDS

    if depth > MAX_DEPTH:
        raise PlanError(f"plan manifest nests control-flow bodies deeper than {MAX_DEPTH} levels; rebuild the plan")

    def dec(layer: str, key: str, v: Any) -> Any:
        if isinstance(v, dict):
            if _TENSOR_KEY in v:
                return tensors[str(v[_TENSOR_KEY])]
            if "$dtype" in v:
                return DType(v["$dtype"])
            if "$network" in v:
                return _network(v["$network"], tensors, f"{prefix}net/{layer}/{key}/", depth + 1)
            raise PlanError("unknown attribute encoding in plan manifest")
        if isinstance(v, list):
            return [dec(layer, key, x) for x in v]
        return v

    net = Network(str(m["name"]))
    for t in m["tensors"]:
        shape = None if t["shape"] is None else tuple(d if isinstance(d, (int, str)) or d is None else _bad()
                                                      for d in t["shape"])
        net.add_tensor(str(t["name"]), DType(t["dtype"]), shape, str(t["kind"]))
    for c in m["constants"]:
        net.constants[str(c)] = tensors[f"{prefix}const/{c}"]
    for c, s in m["strings"].items():
        net.constants[str(c)] = _strings(s["values"], s["shape"])
    net.inputs = [str(x) for x in m["inputs"]]
    net.outputs = [str(x) for x in m["outputs"]]
    for l in m["layers"]:
        if l["kind"] not in KINDS:
            raise PlanError(f"plan uses layer kind {l['kind']!r}, which this kiln does not have; "
                            "rebuild the plan with this version of kiln")
        name = str(l["name"])
        attrs = {str(k): dec(name, k, v) for k, v in l["attrs"].items()}
        net.layers.append(Layer(name, str(l["kind"]), [str(i) for i in l["inputs"]], [str(o) for o in l["outputs"]],
                                attrs, DType(l["precision"]) if l["precision"] else None, [str(o) for o in l["origin"]]))
    return net


def _strings(values: Any, shape: Any) -> np.ndarray:
    """A string constant from its manifest entry: a flat list of str and a shape."""
    if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
        raise ValueError("string constant values are not a list of strings")
    dims = tuple(d if isinstance(d, int) and d >= 0 else _bad() for d in shape)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(dims)


def _bad():
    raise ValueError("bad dimension")
