"""Network ⇄ JSON manifest + named tensors, with no code and no pickle.

Control-flow bodies (Network attributes) nest as JSON manifests inside the layer's attributes,
their tensors stored under a path prefix (net/<layer>/<attribute>/); nesting is capped on load.
String constants (numpy object arrays) are stored in the manifest as JSON lists.
"""

from __future__ import annotations

import shlex
from typing import Any

import numpy as np
import onnx
import torch

from kiln.util.safe_json import printable
from kiln.errors import InternalError, ModelError, PlanError
from kiln.frontend.onnx.limits import ModelLimits
from kiln.ir import DType, Layer, Network
from kiln.kinds.verify import verify_network
from kiln.kinds.registry import attr_problem

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
    """Rebuild a network from an untrusted manifest; any malformation, or a stored tensor whose dtype or shape
    differs from the manifest's declaration, is a PlanError."""
    used: set[str] = set()
    try:
        net = _network(m, tensors, "", 0, used)
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, InternalError, ModelError, RecursionError) as e:
        raise PlanError(f"plan manifest is malformed ({type(e).__name__}: {printable(str(e))}); "
                        "rebuild the plan") from None
    try:
        verify_network(net)
    except Exception as e:
        raise PlanError(f"plan network is inconsistent ({printable(str(e))}); rebuild the plan") from None
    if len(used) != len(tensors):
        raise PlanError(f"plan stores tensors its manifest never names ({printable(sorted(set(tensors) - used)[:3])}"
                        "...); rebuild the plan")
    return net


PLUGIN_KEYS = {"kind", "module", "file", "sha256"}


def plugins_to_json(net: Network) -> list[dict[str, str]]:
    """The plugin ops `net` (its control-flow bodies too) uses, each with the module that registered it (name, file
    name, source sha256): recorded in the plan as data, never imported on load."""
    from kiln.kinds import KINDS

    found: dict[str, dict[str, str]] = {}

    def walk(n: Network) -> None:
        for layer in n.layers:
            k = KINDS.get(layer.kind)
            if k is not None and k.plugin is not None:
                found[layer.kind] = {"kind": layer.kind, **{key: str(k.plugin.get(key, "")) for key in
                                                            ("module", "file", "sha256")}}
            for v in layer.attrs.values():
                for x in v if isinstance(v, (list, tuple)) else [v]:
                    if isinstance(x, Network):
                        walk(x)

    walk(net)
    return [found[k] for k in sorted(found)]


def check_plugins(records: Any, source: str) -> list[str]:
    """Check a plan's plugin records (its manifest's "plugins") against the ops registered in this process: an op
    not registered is a PlanError naming it and the module the plan was built with (kiln never imports it: plans are
    data); returns a warning for each module registered here from another source (sha256) than the plan's."""
    from kiln.kinds import KINDS

    if records is None:
        return []
    if not isinstance(records, list) or not all(isinstance(r, dict) and set(r) == PLUGIN_KEYS
                                                and all(isinstance(v, str) for v in r.values()) for r in records):
        raise PlanError(f"{source}: the manifest's plugin list is malformed; rebuild the plan")
    missing: dict[tuple[str, str, str], list[str]] = {}
    warnings: list[str] = []
    for r in records:
        k = KINDS.get(r["kind"])
        if k is None:
            missing.setdefault((r["module"], r["file"], r["sha256"]), []).append(_op_name(r["kind"]))
        elif k.plugin is not None and r["sha256"] and k.plugin.get("sha256") != r["sha256"]:
            here = k.plugin
            warning = (f"{source} was built with plugin {printable(r['file'] or r['module'])} (sha256 "
                       f"{printable(r['sha256'][:16], quote=False)}...), but its op {_op_name(r['kind'])} is "
                       f"registered here from {printable(here.get('file') or here.get('module'))} (sha256 "
                       f"{printable(str(here.get('sha256'))[:16], quote=False)}...), another source; running with it")
            if warning not in warnings:
                warnings.append(warning)
    if missing:
        parts = []
        for (module, file, sha), ops in missing.items():
            ref = shlex.quote(file or module)
            parts.append(f"{', '.join(ops)} (from plugin module {printable(module)}, file {printable(file)}, sha256 "
                         f"{printable(sha[:16], quote=False)}...): pass `--plugin {printable(ref, quote=False)}` "
                         "to the kiln command (in Python: import that module before kiln.load)")
        raise PlanError(f"{source} uses plugin ops not registered in this process: {'; '.join(parts)}. kiln never "
                        "imports a module a plan names (plans are data), so the plugin must be given explicitly")
    return warnings


def _op_name(kind: str) -> str:
    domain, _, op = kind.rpartition("::")
    return f"{printable(op)} (domain {printable(domain)})" if domain else printable(op)


_NETWORK_KEYS = {"name", "inputs", "outputs", "tensors", "constants", "strings", "layers"}
_TENSOR_KEYS = {"name", "dtype", "kind", "shape"}
_LAYER_KEYS = {"name", "kind", "inputs", "outputs", "attrs", "precision", "origin"}


def _keys(entry: Any, keys: set[str], what: str) -> dict:
    """`entry` as a dict with exactly `keys`, else a PlanError naming `what`."""
    if not isinstance(entry, dict) or set(entry) != keys:
        got = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
        raise PlanError(f"plan manifest: {what} has keys {printable(got)}, expected {sorted(keys)}; rebuild the plan")
    return entry


def _names(values: Any, what: str) -> list[str]:
    """A list of tensor names (str), else a PlanError."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise PlanError(f"plan manifest: {what} is not a list of names; rebuild the plan")
    return values


def _stored(tensors: dict[str, torch.Tensor], key: str, used: set[str]) -> torch.Tensor:
    if key not in tensors:
        raise PlanError(f"plan manifest names tensor {printable(key)}, which the plan does not store; rebuild the plan")
    used.add(key)
    return tensors[key]


def _check_constant(t, value: torch.Tensor) -> None:
    """A stored constant must be exactly what the manifest declares: else it would run as another type."""
    if t.kind != "tensor" or DType.from_torch(value.dtype) != t.dtype or t.shape != tuple(value.shape):
        raise PlanError(f"plan manifest declares constant {printable(t.name)} as {t.type_str()}, but the plan stores "
                        f"{DType.from_torch(value.dtype)}{list(value.shape)}; rebuild the plan")


def _check_layer(l: dict) -> None:
    """A registered kind (a plugin op's kind named as such), some output, and inputs unless its kind takes none."""
    from kiln.kinds import KINDS

    kind, name = l["kind"], printable(l["name"])
    if not isinstance(kind, str) or kind not in KINDS:
        if isinstance(kind, str) and "::" in kind:
            domain, op = kind.split("::", 1)
            raise PlanError(f"plan layer {name} is the plugin op {printable(op)} of domain {printable(domain)}, "
                            "which is not registered in this process; register it before loading, with "
                            f"kiln.plugins.register_op({op!r}, reference, domain={domain!r})")
        raise PlanError(f"plan layer {name} has kind {printable(kind)}, which this kiln does not have; if it is a "
                        "plugin op, register it with kiln.plugins.register_op before loading, else rebuild the plan "
                        "with this version of kiln")
    if not any(_names(l["outputs"], f"outputs of layer {name}")):
        raise PlanError(f"plan layer {name} ({kind}) has no outputs; rebuild the plan")
    if not any(_names(l["inputs"], f"inputs of layer {name}")) and not _takes_no_inputs(kind):
        raise PlanError(f"plan layer {name} ({kind}) has no inputs, and a {kind} layer reads at least one; "
                        "rebuild the plan")


def _takes_no_inputs(kind: str) -> bool:
    """Whether a layer of `kind` may have no inputs: ONNX ops whose schema allows it, and plugin ops."""
    if "::" in kind:
        return True
    try:
        return onnx.defs.get_schema(kind).min_input == 0
    except onnx.defs.SchemaError:
        return False  # kiln's own (fused) kinds all read inputs


def _network(m: dict, tensors: dict[str, torch.Tensor], prefix: str, depth: int, used: set[str]) -> Network:
    if depth > MAX_DEPTH:
        raise PlanError(f"plan manifest nests control-flow bodies deeper than {MAX_DEPTH} levels; rebuild the plan")

    def dec(layer: str, key: str, v: Any) -> Any:
        if isinstance(v, dict):
            if len(v) == 1 and isinstance(v.get(_TENSOR_KEY), str):
                return _stored(tensors, v[_TENSOR_KEY], used)
            if len(v) == 1 and "$dtype" in v:
                return DType(v["$dtype"])
            if len(v) == 1 and "$network" in v:
                return _network(v["$network"], tensors, f"{prefix}net/{layer}/{key}/", depth + 1, used)
            raise PlanError(f"plan layer {printable(layer)}: attribute {printable(key)} has an unknown encoding; "
                            "rebuild the plan")
        if isinstance(v, list):
            return [dec(layer, key, x) for x in v]
        return v

    m = _keys(m, _NETWORK_KEYS, "a network")
    net = Network(str(m["name"]))
    for t in m["tensors"]:
        t = _keys(t, _TENSOR_KEYS, "a tensor entry")
        if not isinstance(t["name"], str) or t["name"] in net.tensors:
            raise PlanError(f"plan manifest declares tensor {printable(t['name'])} twice or by a non-name; "
                            "rebuild the plan")
        shape = None if t["shape"] is None else tuple(_dim(d) for d in t["shape"])
        net.add_tensor(t["name"], DType(t["dtype"]), shape, str(t["kind"]))
    for c in _names(m["constants"], "constants"):
        net.constants[c] = _stored(tensors, f"{prefix}const/{c}", used)
        _check_constant(net.tensors[c], net.constants[c])
    for c, s in m["strings"].items():
        net.constants[str(c)] = _strings(s["values"], s["shape"])
        if net.tensors[c].dtype != DType.STRING or net.tensors[c].shape != net.constants[c].shape:
            raise PlanError(f"plan manifest declares string constant {printable(c)} as {net.tensors[c].type_str()}; "
                            "rebuild the plan")
    net.inputs = _names(m["inputs"], "network inputs")
    net.outputs = _names(m["outputs"], "network outputs")
    for l in m["layers"]:
        l = _keys(l, _LAYER_KEYS, "a layer entry")
        _check_layer(l)
        name = str(l["name"])
        attrs = {str(k): dec(name, k, v) for k, v in l["attrs"].items()}
        problem = attr_problem(l["kind"], attrs)
        if problem:
            raise PlanError(f"plan layer {printable(name)} ({l['kind']}): {printable(problem, quote=False)}; "
                            "rebuild the plan")
        net.layers.append(Layer(name, str(l["kind"]), [str(i) for i in l["inputs"]], [str(o) for o in l["outputs"]],
                                attrs, DType(l["precision"]) if l["precision"] else None,
                                [str(o) for o in l["origin"]]))
    return net


def _strings(values: Any, shape: Any) -> np.ndarray:
    """A string constant from its manifest entry: a flat list of str and a shape."""
    if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
        raise ValueError("string constant values are not a list of strings")
    dims = tuple(d if isinstance(d, int) and d >= 0 else _bad() for d in shape)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(dims)


def _dim(d: Any):
    """A declared dimension: a size, a symbolic name or None (unknown)."""
    if d is None or isinstance(d, str) or isinstance(d, int) and not isinstance(d, bool) and d >= 0:
        return d
    return _bad()


def _bad():
    raise ValueError("bad dimension")
