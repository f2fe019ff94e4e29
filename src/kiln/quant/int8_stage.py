"""The --int8 part of the build's precision stage: find scales (Q/DQ, cache or calibration), then rewrite.

Scales come from, in order: the model's own Q/DQ nodes (never re-calibrated); a --calib-cache file made
with the same calibrator that covers every tensor to quantize; calibration over --calib data (writing
the cache when one is named). Returns notes for the build summary and a record for the plan's build info.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.config import BuildConfig
from kiln.errors import ConfigError
from kiln.ir import Network
from kiln.quant import calib_cache
from kiln.quant.budget import AccuracyBudget, search, validation_batches
from kiln.quant.calibrate import calibration_data, collect, scales_from
from kiln.quant.int8 import apply_int8, candidates
from kiln.quant.scheme import QuantScales


def _from_cache(config: BuildConfig, needed: set[str], have_data: bool) -> tuple[QuantScales, str] | None:
    path = config.calib_cache
    if not path or not Path(path).exists():
        return None
    cache = calib_cache.read(path)
    missing = sorted(needed - set(cache.scales))
    if cache.calibrator == config.calibrator and not missing:
        scales = QuantScales({n: cache.scales[n] for n in needed})
        return scales, (f"calibration cache {path} ({cache.calibrator}, {cache.samples} samples, data sha256 "
                        f"{cache.data_sha256[:12]}…); delete it to recalibrate")
    if have_data:
        return None
    why = (f"was made with the {cache.calibrator} calibrator, not {config.calibrator}" if not missing else
           f"lacks scales for {len(missing)} of {len(needed)} tensors (e.g. {missing[0]!r}): it was made for "
           "another model or kiln version")
    raise ConfigError(f"calibration cache {path} {why}; give --calib DATA to recalibrate (the cache is rewritten)")


def _calibrate(net: Network, config: BuildConfig, device, needed: set[str], source: Any) -> tuple[QuantScales, str]:
    data = calibration_data(source, list(net.inputs), config.calib_batch)
    stats = collect(net, data, needed, device.torch_device)
    scales = scales_from(stats, config.calibrator, config.calib_percentile)
    sha = data.sha256()
    where = f"calibrated ({config.calibrator}) on {data.samples} samples ({data.description})"
    if config.calib_cache:
        calib_cache.CalibrationCache(config.calibrator, config.calib_percentile, sha, data.samples,
                                     scales).write(config.calib_cache)
        where += f"; written to calibration cache {config.calib_cache}"
    return QuantScales(scales), where


def find_scales(net: Network, config: BuildConfig, device, qdq: QuantScales | None,
                calib_data: Any = None) -> tuple[QuantScales | None, str]:
    """The scales to quantize `net` with and where they came from (None: there are none)."""
    if qdq is not None and (qdq.activations or qdq.weights):
        return qdq, "the model's own Q/DQ nodes (not re-calibrated)"
    needed = {c.x for c in candidates(net).values()}
    source = calib_data if calib_data is not None else config.calib
    cached = _from_cache(config, needed, source is not None)
    if cached is not None:
        return cached
    if source is None:
        return None, ""
    return _calibrate(net, config, device, needed, source)


def quantize_int8(net: Network, config: BuildConfig, device, qdq: QuantScales | None = None,
                  calib_data: Any = None, keep_float: set[str] = frozenset(),
                  validation_data: Any = None) -> tuple[list[str], dict]:
    """Run the int8 rewrite on `net` in place; (notes, build-info record)."""
    pinned = set(config.layer_precisions)  # --layer-precision NAME=... keeps a layer out of int8
    keep_float = set(keep_float) | {layer.name for layer in net.layers
                                    if layer.name in pinned or pinned & set(layer.origin)}
    scales, where = find_scales(net, config, device, qdq, calib_data)
    if scales is None:
        return ["--int8: no scales, so no layer runs int8: give calibration data (--calib DATA), a calibration "
                "cache (--calib-cache FILE), or a model with Q/DQ nodes"], {}
    if not config.accuracy:
        return int8_rewrite(net, scales, where, keep_float)
    source = validation_data if validation_data is not None else config.validation
    held_out = source is not None
    source = source if held_out else (calib_data if calib_data is not None else config.calib)
    if source is None:
        raise ConfigError("--accuracy needs validation data: give --validation DATA (a .npz or a folder of "
                          "NAME.npy, like --calib)")
    budget = AccuracyBudget.parse(config.accuracy)
    feeds = validation_batches(net, source, config.calib_batch, device.torch_device)
    fallbacks, found = search(net, scales, budget, feeds, device.torch_device, keep_float)
    notes, record = int8_rewrite(net, scales, where, keep_float | fallbacks)
    for name in found["fallbacks"]:
        record["layers"][name]["reason"] = (f"kept in float by the accuracy budget ({budget.metric} "
                                            f"{found['sensitivity'][name]:.6g} with only this layer float)")
    found["data"] = "validation data" if held_out else "the calibration data (no --validation given)"
    record["budget"] = found
    notes.append(f"accuracy budget {budget}: all-int8 {budget.metric} {found['all_int8']:.6g} on "
                 f"{found['samples']} samples of {found['data']}; "
                 + (f"{len(found['fallbacks'])} most sensitive layers kept float "
                    f"({', '.join(found['fallbacks'][:4])}{' …' if len(found['fallbacks']) > 4 else ''}) → "
                    f"{found['achieved']:.6g}" if found["fallbacks"] else "met with every layer in int8")
                 + ("" if found["met"] else "; NOT met even with every quantizable layer float"))
    return notes, record


def int8_rewrite(net: Network, scales: QuantScales, where: str, keep_float: set[str] = frozenset()):
    """apply_int8 and its report: (notes, build-info record)."""
    before = set(net.tensors)
    result = apply_int8(net, scales, keep_float)
    floats = {n: r for n, r in result.layers.items() if r["precision"] != "int8"}
    notes = list(scales.notes)
    notes.append(f"int8: {len(result.int8)} of {len(result.layers)} quantizable layers run int8; scales from {where}; "
                 f"{result.quantize_layers} QuantizeLinear layers inserted")
    if floats:
        shown = "; ".join(f"{n} ({r['reason']})" for n, r in list(floats.items())[:5])
        notes.append(f"int8: {len(floats)} layers stay float: {shown}{' …' if len(floats) > 5 else ''}")
    if scales.qdq:
        merged = sorted(n for n in scales.activations if n not in before)
        notes.append(f"int8: {len(scales.activations)} Q/DQ activation scales honoured; {result.fake_quant} float "
                     f"readers of quantized tensors read them through explicit Q→DQ layers"
                     + (f"; {len(merged)} Q/DQ points fell inside fused layers (e.g. between a conv and its ReLU) "
                        "and are applied once, at the fused layer's output" if merged else ""))
    tensors = {n: {"scale": s.scale, "source": s.source, **({"min": s.range[0], "max": s.range[1]} if s.range else {})}
               for n, s in scales.activations.items()}
    return notes, {"scales_from": where, "layers": result.layers, "tensors": tensors}
