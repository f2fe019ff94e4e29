"""What an int8 build reports: per-layer precision and scale source, calibrated ranges, engine size by content.

Used by `kiln build` (summary and --json) and `kiln inspect`; reads only the plan's network and build info.
"""

from __future__ import annotations

import torch
from rich.table import Table

from kiln.ir import Network

MAX_ROWS = 40


def int8_summary(info: dict) -> dict:
    """The build-info record of the int8 rewrite, condensed: counts, where scales came from, per-layer rows."""
    rec = info.get("int8") or {}
    layers = rec.get("layers", {})
    tensors = rec.get("tensors", {})
    rows = []
    for name, r in layers.items():
        row = {"layer": name, "kind": r.get("kind"), "precision": r.get("precision")}
        if r.get("precision") == "int8":
            row |= {"scale_source": r.get("scale_source"), "x_scale": r.get("x_scale"), "output": r.get("output")}
        else:
            row["reason"] = r.get("reason")
        rows.append(row)
    return {"int8_layers": sum(r["precision"] == "int8" for r in rows), "quantizable_layers": len(rows),
            "scales_from": rec.get("scales_from"), "layers": rows, "ranges": tensors,
            **({"budget": rec["budget"]} if rec.get("budget") else {})}


def ranges_table(tensors: dict) -> Table:
    """Per-tensor calibrated range and scale (user story 3: calibration reports per-layer ranges)."""
    t = Table(title="int8 activation ranges", title_justify="left")
    for col in ("tensor", "min", "max", "scale", "amax (127·scale)", "source"):
        t.add_column(col, justify="left" if col in ("tensor", "source") else "right")
    for name, r in list(tensors.items())[:MAX_ROWS]:
        lo, hi = r.get("min"), r.get("max")
        t.add_row(name, "" if lo is None else f"{lo:.4g}", "" if hi is None else f"{hi:.4g}", f"{r['scale']:.4g}",
                  f"{127 * r['scale']:.4g}", str(r.get("source", "")))
    if len(tensors) > MAX_ROWS:
        t.add_row(f"… {len(tensors) - MAX_ROWS} more (--json lists all)", "", "", "", "", "")
    return t


def _scale_inputs(net: Network) -> set[str]:
    """Constants that are scales of quantized layers or of Quantize/DequantizeLinear."""
    out = set()
    for layer in net.layers:
        if layer.kind in ("QuantConv", "QuantGemm"):
            out.add(layer.inputs[2])
        elif layer.kind in ("QuantizeLinear", "DequantizeLinear"):
            out.update(n for n in layer.inputs[1:3] if n)
    return out


def size_breakdown(net: Network) -> dict[str, int]:
    """Engine weight bytes by what they hold: int8 weights, fp16/bf16 weights, fp32 weights, scales, other."""
    scales = _scale_inputs(net)
    sizes = {"int8 weights": 0, "fp16/bf16 weights": 0, "fp32 weights": 0, "scales": 0, "other": 0}
    for name, v in net.constants.items():
        if not isinstance(v, torch.Tensor):
            continue
        n = v.numel() * v.element_size()
        if name in scales:
            sizes["scales"] += n
        elif v.dtype == torch.int8:
            sizes["int8 weights"] += n
        elif v.dtype in (torch.float16, torch.bfloat16):
            sizes["fp16/bf16 weights"] += n
        elif v.dtype == torch.float32:
            sizes["fp32 weights"] += n
        else:
            sizes["other"] += n
    return sizes


def layer_precisions(net: Network, info: dict) -> dict[str, dict]:
    """Per layer of the plan: its precision and, for int8 layers, the scale source (calibrated / Q/DQ / cache)."""
    rec = (info.get("int8") or {}).get("layers", {})
    out = {}
    for layer in net.layers:
        r = rec.get(layer.name, {})
        precision = "int8" if layer.kind in ("QuantConv", "QuantGemm") else str(layer.precision or "") or "as typed"
        out[layer.name] = {"precision": precision, "scale_source": r.get("scale_source", "")}
    return out
