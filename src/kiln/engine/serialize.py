"""Network ⇄ JSON manifest + named tensors, with no code and no pickle."""

from __future__ import annotations

from typing import Any

import torch

from kiln.errors import PlanError
from kiln.ir import DType, Layer, Network

_TENSOR_KEY = "$tensor"


def network_to_json(net: Network) -> tuple[dict, dict[str, torch.Tensor]]:
    """(manifest dict, tensors to store); attribute tensors are stored beside the constants."""
    tensors: dict[str, torch.Tensor] = {f"const/{k}": v.contiguous() for k, v in net.constants.items()}

    def enc(layer: Layer, key: str, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            name = f"attr/{layer.name}/{key}"
            tensors[name] = v.contiguous()
            return {_TENSOR_KEY: name}
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
        "tensors": [{"name": t.name, "dtype": t.dtype.value, "shape": None if t.shape is None else list(t.shape)}
                    for t in net.tensors.values()],
        "constants": list(net.constants),
        "layers": [{"name": l.name, "kind": l.kind, "inputs": l.inputs, "outputs": l.outputs,
                    "attrs": {k: enc(l, k, v) for k, v in l.attrs.items()},
                    "precision": l.precision.value if l.precision else None, "origin": l.origin}
                   for l in net.layers],
    }
    return manifest, tensors


def network_from_json(m: dict, tensors: dict[str, torch.Tensor]) -> Network:
    """Rebuild a network from an untrusted manifest; any malformation is a PlanError."""
    from kiln.kinds import KINDS

    def dec(v: Any) -> Any:
        if isinstance(v, dict):
            if _TENSOR_KEY in v:
                return tensors[str(v[_TENSOR_KEY])]
            if "$dtype" in v:
                return DType(v["$dtype"])
            raise PlanError("unknown attribute encoding in plan manifest")
        if isinstance(v, list):
            return [dec(x) for x in v]
        return v

    try:
        net = Network(str(m["name"]))
        for t in m["tensors"]:
            shape = None if t["shape"] is None else tuple(d if isinstance(d, (int, str)) or d is None else _bad()
                                                          for d in t["shape"])
            net.add_tensor(str(t["name"]), DType(t["dtype"]), shape)
        for c in m["constants"]:
            net.constants[str(c)] = tensors[f"const/{c}"]
        net.inputs = [str(x) for x in m["inputs"]]
        net.outputs = [str(x) for x in m["outputs"]]
        for l in m["layers"]:
            if l["kind"] not in KINDS:
                raise PlanError(f"plan uses layer kind {l['kind']!r}, which this kiln does not have; "
                                "rebuild the plan with this version of kiln")
            net.layers.append(Layer(str(l["name"]), str(l["kind"]), [str(i) for i in l["inputs"]],
                                    [str(o) for o in l["outputs"]], {str(k): dec(v) for k, v in l["attrs"].items()},
                                    DType(l["precision"]) if l["precision"] else None,
                                    [str(o) for o in l["origin"]]))
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PlanError(f"plan manifest is malformed ({type(e).__name__}: {e}); rebuild the plan") from None
    try:
        net.verify()
    except Exception as e:
        raise PlanError(f"plan network is inconsistent ({e}); rebuild the plan") from None
    return net


def _bad():
    raise ValueError("bad dimension")
