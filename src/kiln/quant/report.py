"""What an int8 / fp8 build reports: per-layer precision and scale source, calibrated ranges, engine size by content.

Used by `kiln build` (summary and --json) and `kiln inspect`; reads only the plan's network and build info.
The build info keeps the quantization record under "int8" for either type; its "qtype" says which.
"""

from __future__ import annotations

import torch
from rich.table import Table

from kiln.ir import Network
from kiln.kinds import qtype as qtypes, quantized

MAX_ROWS = 40
QUANTIZED = quantized.KINDS


def record_qtype(info: dict) -> qtypes.QType:
    """The quantized type of a build's record (int8 for records made before fp8 existed)."""
    return qtypes.QTYPES.get((info.get("int8") or {}).get("qtype") or "int8", qtypes.INT8)


def int8_summary(info: dict) -> dict:
    """The build-info record of the int8 / fp8 rewrite, condensed: counts, where scales came from, per-layer rows."""
    rec = info.get("int8") or {}
    qtype = record_qtype(info)
    layers = rec.get("layers", {})
    tensors = rec.get("tensors", {})
    rows = []
    for name, r in layers.items():
        row = {"layer": name, "kind": r.get("kind"), "precision": r.get("precision")}
        if r.get("precision") != "float":
            row |= {"scale_source": r.get("scale_source"), "x_scale": r.get("x_scale"), "output": r.get("output"),
                    **({"residual": r["residual"]} if "residual" in r else {})}
        else:
            row["reason"] = r.get("reason")
        rows.append(row)
    quantized = sum(r["precision"] != "float" for r in rows)
    return {"precision": qtype.label, f"{qtype.label}_layers": quantized, "quantized_layers": quantized,
            "quantizable_layers": len(rows), "scales_from": rec.get("scales_from"), "qmax": qtype.qmax,
            "layers": rows, "ranges": tensors, **({"budget": rec["budget"]} if rec.get("budget") else {})}


def ranges_table(tensors: dict, qtype: qtypes.QType = qtypes.INT8) -> Table:
    """Per-tensor calibrated range and scale (user story 3: calibration reports per-layer ranges)."""
    q = f"{qtype.qmax:g}"
    t = Table(title=f"{qtype.label} activation ranges", title_justify="left")
    for col in ("tensor", "min", "max", "scale", f"amax ({q}·scale)", "source"):
        t.add_column(col, justify="left" if col in ("tensor", "source") else "right")
    for name, r in list(tensors.items())[:MAX_ROWS]:
        lo, hi = r.get("min"), r.get("max")
        t.add_row(name, "" if lo is None else f"{lo:.4g}", "" if hi is None else f"{hi:.4g}", f"{r['scale']:.4g}",
                  f"{qtype.qmax * r['scale']:.4g}", str(r.get("source", "")))
    if len(tensors) > MAX_ROWS:
        t.add_row(f"… {len(tensors) - MAX_ROWS} more (--json lists all)", "", "", "", "", "")
    return t


def _scale_inputs(net: Network) -> set[str]:
    """Constants that are scales of quantized layers or of Quantize/DequantizeLinear."""
    out = set()
    for layer in net.layers:
        if layer.kind in QUANTIZED:
            second = layer.kind in ("QuantConvPair", "QuantConvChain")  # the second conv's scale: input 6
            out.update(layer.inputs[2:3] + (layer.inputs[6:7] if second else []))
        elif layer.kind in ("QuantizeLinear", "DequantizeLinear"):
            out.update(n for n in layer.inputs[1:3] if n)
    return out


def size_breakdown(net: Network) -> dict[str, int]:
    """Engine weight bytes by what they hold: int8 weights, fp8 weights, fp16/bf16 weights, fp32 weights, scales,
    other."""
    scales = _scale_inputs(net)
    sizes = {"int8 weights": 0, "fp8 weights": 0, "fp16/bf16 weights": 0, "fp32 weights": 0, "scales": 0,
             "other": 0}
    for name, v in net.constants.items():
        if not isinstance(v, torch.Tensor):
            continue
        n = v.numel() * v.element_size()
        if name in scales:
            sizes["scales"] += n
        elif v.dtype == torch.int8:
            sizes["int8 weights"] += n
        elif v.dtype == torch.float8_e4m3fn:
            sizes["fp8 weights"] += n
        elif v.dtype in (torch.float16, torch.bfloat16):
            sizes["fp16/bf16 weights"] += n
        elif v.dtype == torch.float32:
            sizes["fp32 weights"] += n
        else:
            sizes["other"] += n
    return sizes


def layer_precisions(net: Network, info: dict) -> dict[str, dict]:
    """Per layer of the plan: its precision and, for int8 / fp8 layers, the scale source (calibrated / Q/DQ /
    cache)."""
    rec = (info.get("int8") or {}).get("layers", {})
    out = {}
    for layer in net.layers:
        r = rec.get(layer.name, {})
        precision = qtypes.of(layer.attrs).label if layer.kind in QUANTIZED else str(layer.precision or "") \
            or "as typed"
        out[layer.name] = {"precision": precision, "scale_source": r.get("scale_source", "")}
    return out
