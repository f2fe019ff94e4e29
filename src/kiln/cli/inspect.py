"""`kiln inspect FILE`: what a plan holds (header, layers, memory) or what an ONNX model needs (ops, support)."""

from __future__ import annotations

import collections
import datetime
import math
from pathlib import Path
from typing import Annotated

import onnx
import torch
import typer
from rich.table import Table

from kiln.cli.errors import command
from kiln.cli.options import Json, Verbose, is_onnx
from kiln.cli.output import add_row, fmt_bytes, key_values, print_json, stdout
from kiln.engine import plan
from kiln.engine.serialize import network_from_json
from kiln.errors import ConfigError, ModelError
from kiln.frontend.onnx.loader import parse, validate_fields
from kiln.frontend.onnx.registry import lookup
from kiln.ir import Layer, Network


def _bytes(value) -> int:
    """Bytes of a tensor, or of the tensors in a (nested) list attribute."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _tensor(net: Network, name: str) -> dict:
    t = net.tensors[name]
    return {"name": name, "dtype": str(t.dtype), "shape": t.shape_str()}


def _layer(net: Network, index: int, layer: Layer, entry: dict) -> dict:
    outputs = [o for o in layer.outputs if o]
    weights = {i for i in layer.inputs if i in net.constants}
    return {"index": index, "name": layer.name, "kind": layer.kind,
            "precision": str(layer.precision or (net.tensors[outputs[0]].dtype if outputs else "-")),
            "origin": layer.origin,
            "inputs": [_tensor(net, i) for i in layer.inputs if i and i not in net.constants],
            "outputs": [_tensor(net, o) for o in outputs],
            "weight_bytes": sum(_bytes(net.constants[w]) for w in weights) + _bytes(list(layer.attrs.values())),
            "tactic": entry.get("tactic") or "reference"}


def describe_plan(path: Path, header_only: bool) -> dict:
    """The header alone (payload untouched), or everything the plan records."""
    header = plan.read_header(path)
    if header_only:
        return {"file": str(path), "header": header}
    p = plan.read(path)
    net = network_from_json(p.manifest.get("network"), p.tensors)
    layers = [_layer(net, k, layer, entry)
              for k, (layer, entry) in enumerate(zip(net.layers, p.manifest["network"]["layers"], strict=True))]
    build = p.manifest.get("build") or {}
    return {"file": str(path), "header": header, "config": p.manifest.get("config") or {}, "layers": layers,
            "memory": {"plan_bytes": path.stat().st_size,
                       "weight_bytes": net.weight_bytes() + sum(_bytes(list(x.attrs.values())) for x in net.layers),
                       "arena_bytes": (p.manifest.get("memory") or {}).get("arena_bytes")},
            "totals": {"layers": len(layers), "onnx_nodes": build.get("onnx_nodes"),
                       "kinds": dict(collections.Counter(x.kind for x in net.layers).most_common()),
                       "passes": build.get("passes", {}), "notes": build.get("notes", [])}}


def _nodes(graph: onnx.GraphProto):
    """Every node of `graph` and of its subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _nodes(sub)


def _value(vi: onnx.ValueInfoProto) -> dict:
    tt = vi.type.tensor_type
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    dtype = onnx.TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type else "?"
    return {"name": vi.name, "dtype": dtype, "shape": "[" + ",".join(dims) + "]" if tt.HasField("shape") else "?"}


def describe_onnx(path: Path) -> dict:
    """Op counts, which of them kiln imports at the model's opsets, inputs, outputs and parameter count."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist or is not a file")
    proto = parse(path.read_bytes(), str(path))
    validate_fields(proto, str(path))
    graph = proto.graph
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    counts = collections.Counter(("" if n.domain == "ai.onnx" else n.domain, n.op_type) for n in _nodes(graph))
    ops = [{"op": op, "domain": domain or "ai.onnx", "opset": opsets.get(domain), "count": n,
            "supported": lookup(domain, op, opsets.get(domain, 0)) is not None}
           for (domain, op), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][1]))]
    initializers = {t.name for t in graph.initializer}
    return {"file": str(path), "ir_version": proto.ir_version, "producer": proto.producer_name,
            "opsets": {d or "ai.onnx": v for d, v in opsets.items()}, "nodes": sum(counts.values()),
            "parameters": sum(math.prod(t.dims) for t in graph.initializer),
            "inputs": [_value(vi) for vi in graph.input if vi.name not in initializers],
            "outputs": [_value(vi) for vi in graph.output], "ops": ops,
            "unsupported": [o["op"] for o in ops if not o["supported"]]}


def _io(t: dict) -> str:
    return f"{t['name']}: {t['dtype']}{t['shape']}"


def _shapes(tensors: list[dict]) -> str:
    """dtype[shape] per line; the tensor names are left to --json to keep the table narrow."""
    return "\n".join(f"{t['dtype']}{t['shape']}" for t in tensors)


def print_plan(d: dict) -> None:
    h = dict(d["header"])
    device = h.pop("device", None)
    sig = h.get("signature")
    if isinstance(sig, dict):  # the value is for machines; people need the algorithm and the key
        h["signature"] = f"{sig.get('alg')}, key {sig.get('key_id')} (check it with --verify-key on load)"
    if isinstance(h.get("created"), (int, float)):
        h["created"] = datetime.datetime.fromtimestamp(h["created"]).isoformat(timespec="seconds")
    rows = list(h.items())
    rows += [(f"device.{k}", v) for k, v in device.items()] if isinstance(device, dict) else [("device", device)]
    stdout().print(key_values(f"Plan {d['file']}", rows))
    if "layers" not in d:
        return
    table = Table(title="Layers", title_justify="left")
    for col in ("#", "name", "kind", "precision", "fused ONNX nodes", "inputs", "outputs", "weights", "tactic"):
        table.add_column(col, overflow="fold", no_wrap=col in ("#", "precision", "weights", "tactic"))
    for row in d["layers"]:
        add_row(table, row["index"], row["name"], row["kind"], row["precision"], ", ".join(row["origin"]),
                _shapes(row["inputs"]), _shapes(row["outputs"]), fmt_bytes(row["weight_bytes"]), row["tactic"])
    stdout().print(table)
    m, t = d["memory"], d["totals"]
    arena = fmt_bytes(m["arena_bytes"]) if m["arena_bytes"] is not None else "sized at run time (dynamic shapes)"
    rows = [("plan file", fmt_bytes(m["plan_bytes"])), ("weights", fmt_bytes(m["weight_bytes"])),
            ("activation arena", arena), ("ONNX nodes → layers", f"{t['onnx_nodes']} → {t['layers']}"),
            ("layer kinds", ", ".join(f"{k} ×{n}" for k, n in t["kinds"].items())),
            ("passes applied", ", ".join(f"{k} ×{n}" for k, n in t["passes"].items()) or "none")]
    rows += [("note", n) for n in t["notes"]]
    stdout().print(key_values("Memory and totals", rows))


def print_onnx(d: dict) -> None:
    rows = [("IR version", d["ir_version"]), ("producer", d["producer"] or "-"),
            ("opsets", ", ".join(f"{k} {v}" for k, v in d["opsets"].items())), ("nodes", d["nodes"]),
            ("parameters", f"{d['parameters']:,}"), ("inputs", "\n".join(map(_io, d["inputs"]))),
            ("outputs", "\n".join(map(_io, d["outputs"])))]
    stdout().print(key_values(f"ONNX model {d['file']}", rows))
    table = Table(title="Ops", title_justify="left")
    for col in ("op", "domain", "count", "kiln imports it"):
        table.add_column(col)
    for o in d["ops"]:
        add_row(table, o["op"], o["domain"], str(o["count"]), "yes" if o["supported"] else "NO")
    stdout().print(table)
    if d["unsupported"]:
        stdout().print(f"kiln cannot import {', '.join(d['unsupported'])}: building this model will fail; "
                       "supply them with kiln.plugins.register_op", markup=False)


@command
def inspect(
    path: Annotated[Path, typer.Argument(help="A plan file or an .onnx model.", show_default=False)],
    header: Annotated[bool, typer.Option("--header", help="Print only a plan's header, without reading the rest."
                                         )] = False,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Show what a plan holds (header, layers, memory) or which ops an ONNX model uses and whether kiln has them."""
    if is_onnx(path):
        if header:
            raise ConfigError("--header applies to plan files; an .onnx model has no kiln header")
        d = describe_onnx(path)
    else:
        d = describe_plan(path, header)
    if as_json:
        print_json(d)
    else:
        (print_onnx if is_onnx(path) else print_plan)(d)
