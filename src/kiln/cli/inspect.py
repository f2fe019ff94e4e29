"""`kiln inspect FILE`: what a plan holds (header, layers, memory) or what an ONNX model needs (ops, support)."""

from __future__ import annotations

import collections
import datetime
import math
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from kiln.cli.build import build_time, build_time_table
from kiln.cli.errors import command, one_line
from kiln.cli.options import Json, Verbose, is_onnx
from kiln.cli.options import Plugin, load_plugins
from kiln.cli.output import add_row, fmt_arena, fmt_bytes, key_values, print_json, stdout
from kiln.errors import ConfigError, UnsupportedOpError
from kiln.util.safe_json import printable

if TYPE_CHECKING:  # the heavy imports (torch, onnx, the IR) happen in the functions: `kiln --help` stays fast
    import onnx
    import torch

    from kiln.ir import Layer, Network


def _bytes(value) -> int:
    """Bytes of a tensor, or of the tensors in a (nested) list attribute."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _tensor(net: Network, name: str) -> dict:
    t = net.tensors[name]
    return {"name": name, "dtype": str(t.dtype), "shape": t.shape_str()}


def _layer(net: Network, index: int, layer: Layer, choice: dict) -> dict:
    """One layer's row: fused ONNX nodes, precision, tactic with its config, shapes, memory format, weights."""
    outputs = [o for o in layer.outputs if o]
    weights = {i for i in layer.inputs if i in net.constants}
    config = choice.get("config") if isinstance(choice.get("config"), dict) else {}
    return {"index": index, "name": layer.name, "kind": layer.kind,
            "precision": str(layer.precision or (net.tensors[outputs[0]].dtype if outputs else "-")),
            "origin": layer.origin,
            "inputs": [_tensor(net, i) for i in layer.inputs if i and i not in net.constants],
            "outputs": [_tensor(net, o) for o in outputs],
            "weight_bytes": sum(_bytes(net.constants[w]) for w in weights) + _bytes(list(layer.attrs.values())),
            "tactic": str(choice.get("tactic") or "reference"), "tactic_config": config,
            "tactic_source": choice.get("source"), "tactic_us": choice.get("microseconds"),
            "tactic_timed": choice.get("timed") or [], "tactic_rejected": choice.get("rejected") or [],
            "format": _FORMATS.get(str(config.get("layout", "")).lower(), "linear")}


_FORMATS = {"nhwc": "NHWC", "nchw": "NCHW"}  # conv layouts; every other tensor is linear (row-major)


def _weights_by_dtype(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Stored weight bytes per dtype, largest first."""
    out: dict[str, int] = collections.Counter()
    for t in tensors.values():
        out[str(t.dtype).removeprefix("torch.")] += _bytes(t)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _size_breakdown(path: Path, tensors: dict[str, torch.Tensor]) -> dict:
    """The plan file's bytes by what they hold: header, manifest, weights by dtype, and the rest (the
    safetensors index and alignment). Read after `plan.read` has checked the file."""
    from kiln.engine import plan

    with open(path, "rb") as f:
        hlen = plan.PREFIX.unpack(f.read(plan.PREFIX.size))[2]
        f.seek(plan.PREFIX.size + hlen)
        (mlen,) = struct.unpack("<Q", f.read(8))
    total = path.stat().st_size
    by_dtype = _weights_by_dtype(tensors)
    header = plan.PREFIX.size + hlen
    return {"total": total, "header": header, "manifest": mlen + 8, "weights": sum(by_dtype.values()),
            "weights_by_dtype": by_dtype, "other": total - header - mlen - 8 - sum(by_dtype.values())}


def describe_plan(path: Path, header_only: bool) -> dict:
    """The header alone (payload untouched), or everything the plan records."""
    from kiln.engine import plan
    from kiln.engine.serialize import check_plugins, network_from_json
    from kiln.kinds import quantized
    from kiln.quant.report import layer_precisions, size_breakdown

    header = plan.read_header(path)
    if header_only:
        return {"file": str(path), "header": header}
    p = plan.read(path)
    for warning in check_plugins(p.manifest.get("plugins"), str(path)):  # never imports what the plan names
        typer.echo(f"warning: {one_line(warning)}", err=True)
    net = network_from_json(p.manifest.get("network"), p.tensors)
    tactics = p.manifest.get("tactics") if isinstance(p.manifest.get("tactics"), dict) else {}
    layers = [_layer(net, k, layer, tactics.get(layer.name) if isinstance(tactics.get(layer.name), dict) else {})
              for k, layer in enumerate(net.layers)]
    build = p.manifest.get("build") or {}
    config = p.manifest.get("config") or {}
    for row, q in zip(layers, layer_precisions(net, build).values()):  # int8/fp8: where each layer's scales came from
        row["scale_source"] = q["scale_source"]
        if row["kind"] in quantized.KINDS:
            row["precision"] = q["precision"]  # "int8" / "fp8", not the IR type name (float8_e4m3fn)
    return {"file": str(path), "header": header, "config": config, "layers": layers,
            "profiles": _profiles(config, tactics, p.manifest.get("profile_tactics")),
            "memory": {"plan_bytes": path.stat().st_size,
                       "weight_bytes": net.weight_bytes() + sum(_bytes(list(x.attrs.values())) for x in net.layers),
                       "arena_bytes": (p.manifest.get("memory") or {}).get("arena_bytes"),
                       "arena": fmt_arena(p.manifest.get("memory") or {}),
                       "workspace_limit_bytes": config.get("workspace_bytes")},
            "size": _size_breakdown(path, p.tensors) | {"by_content": size_breakdown(net)},
            "totals": {"layers": len(layers), "onnx_nodes": build.get("onnx_nodes"),
                       "kinds": dict(collections.Counter(x.kind for x in net.layers).most_common()),
                       "passes": build.get("passes", {}), "notes": build.get("notes", [])},
            "build_time": build_time(build if isinstance(build, dict) else {})}


def _profiles(config: dict, tactics: dict, others) -> list[dict]:
    """Each optimization profile: its min/opt/max per input, and (after the first) the layers whose tactic differs
    from profile 0's, with that profile's choices (rejected candidates included) for every layer it records."""
    others = others if isinstance(others, list) else []
    out = []
    for k, ranges in enumerate(config.get("profiles") or []):
        own = others[k - 1] if 0 < k <= len(others) and isinstance(others[k - 1], dict) else {}
        own = {n: c for n, c in own.items() if isinstance(c, dict)}
        first = lambda n: tactics.get(n) if isinstance(tactics.get(n), dict) else {}  # noqa: E731
        unlike = {n: _choice_label(c) for n, c in own.items()
                  if (c.get("tactic"), c.get("config")) != (first(n).get("tactic"), first(n).get("config"))}
        out.append({"index": k, "inputs": ranges if isinstance(ranges, dict) else {},
                    "tactics_unlike_profile_0": unlike, "tactics": own})
    return out


def _choice_label(choice: dict) -> str:
    """tactic{config} of a manifest's choice, as the autotuner labels its candidates."""
    config = choice.get("config")
    return f"{choice.get('tactic') or 'reference'}{config or ''}"


def _nodes(graph: onnx.GraphProto):
    """Every node of `graph` and of its subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _nodes(sub)


def _value(vi: onnx.ValueInfoProto) -> dict:
    import onnx

    tt = vi.type.tensor_type
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    dtype = onnx.TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type else "?"
    return {"name": vi.name, "dtype": dtype, "shape": "[" + ",".join(dims) + "]" if tt.HasField("shape") else "?"}


def describe_onnx(path: Path) -> dict:
    """Op counts, which of them kiln imports at the model's opsets, inputs, outputs and parameter count."""
    from kiln.frontend.onnx.external_data import external_tensors, resolve_location
    from kiln.frontend.onnx.loader import read_model
    from kiln.frontend.onnx.registry import lookup

    proto = read_model(path)
    for t in external_tensors(proto):  # a location leaving the model's folder is an error, not a table row
        resolve_location(path.parent, {e.key: e.value for e in t.external_data}.get("location", ""), t.name)
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
            "unsupported": [o["op"] for o in ops if not o["supported"]],
            "fusions": planned_fusions(path) if all(o["supported"] for o in ops) else
            {"error": "not computed: the model has ops kiln cannot import"},
            "pass_pipeline": pass_pipeline()}


def pass_pipeline() -> list[dict]:
    """The ordered passes a build runs (quant/pipeline.py): the float graph passes, then the precision passes,
    each with its stage and the build flags or device under which it runs."""
    from kiln.quant.pipeline import PIPELINE

    return [{"pass": s.name, "stage": s.stage.value, "runs": s.condition} for s in PIPELINE]


def planned_fusions(path: Path) -> dict:
    """Import the model and run the build's graph passes (no device, no tuning): which layers several ONNX
    nodes become, by kind, and what each pass did. An op kiln cannot import is reported; an invalid model raises."""
    from kiln.frontend.onnx import import_onnx, load_onnx
    from kiln.passes import PassContext, default_passes, run_passes

    try:
        net = import_onnx(load_onnx(path).proto)
        imported = len(net.layers)
        pctx = PassContext()
        net = run_passes(net, default_passes(), pctx)
    except UnsupportedOpError as e:
        return {"error": one_line(e)}
    fused = [layer for layer in net.layers if len(layer.origin) > 1]
    kinds: dict[str, dict[str, int]] = {}
    for layer in fused:
        entry = kinds.setdefault(layer.kind, {"count": 0, "onnx_nodes": 0})
        entry["count"] += 1
        entry["onnx_nodes"] += len(layer.origin)
    return {"imported_layers": imported, "layers": len(net.layers), "passes": dict(pctx.log),
            "fused_kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["count"])),
            "fused_layers": [{"name": x.name, "kind": x.kind, "origin": x.origin} for x in fused]}


def _io(t: dict) -> str:
    return f"{t['name']}: {t['dtype']}{t['shape']}"


def _shapes(tensors: list[dict]) -> str:
    """dtype[shape] per line; the tensor names are left to --json to keep the table narrow."""
    return "\n".join(f"{t['dtype']}{t['shape']}" for t in tensors)


def _escaped(value):
    """A plan's text with control characters escaped, all through (keys too): never sent raw to a terminal."""
    if isinstance(value, str):
        return printable(value, quote=False)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    return [_escaped(v) for v in value] if isinstance(value, (list, tuple)) else value


def print_plan(d: dict) -> None:
    d = _escaped(d)
    h = dict(d["header"])
    device = h.pop("device", None)
    sig = h.get("signature")
    if isinstance(sig, dict):  # the value is for machines; people need the algorithm and the key
        h["signature"] = f"{sig.get('alg')}, key {sig.get('key_id')} (check it with --verify-key on load)"
    if isinstance(h.get("created"), (int, float)):
        try:
            h["created"] = datetime.datetime.fromtimestamp(h["created"]).isoformat(timespec="seconds")
        except (OverflowError, OSError, ValueError):
            pass  # a time no calendar holds: shown as the number it is
    rows = list(h.items())
    rows += [(f"device.{k}", v) for k, v in device.items()] if isinstance(device, dict) else [("device", device)]
    stdout().print(key_values(f"Plan {d['file']}", rows))
    if "layers" not in d:
        return
    table = Table(title="Layers", title_justify="left")
    for col in ("#", "name", "kind", "precision", "fused ONNX nodes", "inputs", "outputs", "weights", "tactic"):
        table.add_column(col, overflow="fold", no_wrap=col in ("#", "precision", "weights", "tactic"))
    for row in d["layers"]:
        layout = "" if row["format"] == "linear" else f"\n({row['format']})"  # linear is the rule; say exceptions
        scales = f"\nscales: {row['scale_source']}" if row.get("scale_source") else ""  # int8: calibrated / Q/DQ
        add_row(table, row["index"], row["name"], row["kind"], row["precision"] + scales, ", ".join(row["origin"]),
                _shapes(row["inputs"]), _shapes(row["outputs"]) + layout, fmt_bytes(row["weight_bytes"]),
                _tactic(row))
    stdout().print(table)
    _print_profiles(d.get("profiles") or [])
    m, t, z = d["memory"], d["totals"], d["size"]
    workspace = m["workspace_limit_bytes"]
    rows = [("plan file", fmt_bytes(m["plan_bytes"])),
            ("  header", fmt_bytes(z["header"])), ("  manifest (layers, tactics, config)", fmt_bytes(z["manifest"])),
            *((f"  weights {dtype}", fmt_bytes(n)) for dtype, n in z["weights_by_dtype"].items()),
            ("  other (weights index, padding)", fmt_bytes(z["other"])),
            *((f"weights by content: {k}", fmt_bytes(n)) for k, n in z.get("by_content", {}).items()),
            ("weights on the device", fmt_bytes(m["weight_bytes"])), ("activation arena", m["arena"]),
            ("workspace", f"at most {fmt_bytes(workspace)} per kernel" if workspace is not None
             else "no limit set (kernels take what their library asks for)"),
            ("ONNX nodes → layers", f"{t['onnx_nodes']} → {t['layers']}"),
            ("layer kinds", ", ".join(f"{k} ×{n}" for k, n in t["kinds"].items())),
            ("passes applied", ", ".join(f"{k} ×{n}" for k, n in t["passes"].items()) or "none")]
    rows += [("note", n) for n in t["notes"]]
    stdout().print(key_values("Memory and totals", rows))
    if d.get("build_time"):
        stdout().print(build_time_table(d["build_time"]))


def _print_profiles(profiles: list[dict]) -> None:
    """The optimization profiles table: one row per input of each profile, and its tactics unlike profile 0's."""
    if not profiles:
        return
    table = Table(title="Optimization profiles (each tuned at its opt shapes)", title_justify="left")
    for col in ("#", "input", "min", "opt", "max", "tactics unlike profile 0's"):
        table.add_column(col, overflow="fold")
    dims = lambda s: "x".join(map(str, s)) if isinstance(s, list) else str(s)  # noqa: E731
    for p in profiles:
        unlike = "\n".join(f"{n}: {t}" for n, t in p["tactics_unlike_profile_0"].items())
        unlike = unlike or ("-" if p["index"] == 0 else "none")
        rows = [(n, r) for n, r in p["inputs"].items() if isinstance(r, dict)] or [("-", {})]
        for i, (name, r) in enumerate(rows):
            add_row(table, p["index"] if i == 0 else "", name, dims(r.get("min", "")), dims(r.get("opt", "")),
                    dims(r.get("max", "")), unlike if i == 0 else "")
    stdout().print(table)


def _tactic(row: dict) -> str:
    """Tactic, its config (key=value) and its timed cost, on separate lines."""
    lines = [row["tactic"]]
    if row["tactic_config"]:
        lines += [f"{k}={v}" for k, v in row["tactic_config"].items()]
    if isinstance(row.get("tactic_us"), (int, float)):
        lines.append(f"{row['tactic_us']:.1f} µs ({row.get('tactic_source') or '-'})")
    if len(row.get("tactic_timed") or []) > 1:  # the candidates the autotuner timed: the runner-up's cost
        label, us = row["tactic_timed"][1]
        lines.append(f"best of {len(row['tactic_timed'])}; next {us:.1f} µs {label.split('{')[0]}")
    return "\n".join(lines)


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
    f = d["fusions"]
    if "error" in f:
        stdout().print(f"fusions: {f['error']}", markup=False)
    else:
        table = Table(title=f"Fusions the build will apply ({f['imported_layers']} imported layers → {f['layers']} "
                            "after the graph passes)", title_justify="left")
        for col in ("fused kind", "layers", "ONNX nodes in them"):
            table.add_column(col)
        for kind, n in f["fused_kinds"].items():
            add_row(table, kind, n["count"], n["onnx_nodes"])
        if not f["fused_kinds"]:
            add_row(table, "none", 0, 0)
        stdout().print(table)
        if f["passes"]:
            stdout().print("passes: " + ", ".join(f"{k} ×{n}" for k, n in f["passes"].items()), markup=False)
    table = Table(title="Passes a build runs, in order (to a fixpoint within each stage)", title_justify="left")
    for col in ("#", "pass", "stage", "runs"):
        table.add_column(col)
    for k, step in enumerate(d["pass_pipeline"]):
        add_row(table, k, step["pass"], step["stage"], step["runs"])
    stdout().print(table)
    if d["unsupported"]:
        stdout().print(f"kiln cannot import {', '.join(d['unsupported'])}: building this model will fail; "
                       "supply them with kiln.plugins.register_op", markup=False)


@command
def inspect(
    path: Annotated[Path, typer.Argument(help="A plan file or an .onnx model.", show_default=False)],
    header: Annotated[bool, typer.Option("--header", help="Print only a plan's header, without reading the rest."
                                         )] = False,
    plugin: Plugin = None,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Show what a plan holds (header, layers, memory) or which ops an ONNX model uses and whether kiln has them."""
    load_plugins(plugin)
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
