"""The --int8 / --fp8 part of the build's precision stage: find scales (Q/DQ, cache or calibration), then rewrite.

Scales come from, in order: the model's own Q/DQ nodes (never re-calibrated; int8 only); a --calib-cache file
made with the same calibrator that covers every tensor to quantize; calibration over --calib data (writing
the cache when one is named). With smooth_alpha (quant/smooth.py), calibration runs twice over data held in
memory: per-channel ranges first, then the smoothed GEMM inputs' scales (no cache). --fp8 takes the same int8
scales as amax / 127 and divides by 448 instead (scheme.for_qtype); with --int8 and --fp8 both, every quantizable
layer runs fp8. Returns notes for the build summary and a record for the plan's build info (key "int8" for either
type; its "qtype" says which).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.config import BuildConfig
from kiln.errors import ConfigError
from kiln.ir import Network
from kiln.quant import calib_cache
from kiln.quant.budget import AccuracyBudget, search, validation_batches
from kiln.kinds.qtype import FP8, INT8, QType
from kiln.quant.calibrate import CalibrationData, calibration_data, collect, scales_from
from kiln.quant.int8 import apply_int8, candidates
from kiln.quant.scheme import QuantScales, for_qtype
from kiln.quant.smooth import ChannelAmax, apply_smoothing, factors, smoothable
from kiln.util.phases import PhaseTimes

NO_SCALES = ("give calibration data (--calib DATA) or a calibration cache (--calib-cache FILE, made by an earlier "
             "--int8 or --fp8 build)")


def build_qtype(config: BuildConfig) -> QType:
    """The type quantized layers get: fp8 when --fp8 is given (with or without --int8), else int8."""
    return FP8 if config.fp8 else INT8


def _from_cache(config: BuildConfig, needed: set[str], optional: set[str],
                have_data: bool) -> tuple[QuantScales, str] | None:
    path = config.calib_cache
    if not path or not Path(path).exists():
        return None
    cache = calib_cache.read(path)
    missing = sorted(needed - set(cache.scales))
    if cache.calibrator == config.calibrator and not missing:
        scales = QuantScales({n: cache.scales[n] for n in needed | (optional & set(cache.scales))})
        return scales, (f"calibration cache {path} ({cache.calibrator}, {cache.samples} samples, data sha256 "
                        f"{cache.data_sha256[:12]}…); delete it to recalibrate")
    if have_data:
        return None
    why = (f"was made with the {cache.calibrator} calibrator, not {config.calibrator}" if not missing else
           f"lacks scales for {len(missing)} of {len(needed)} tensors (e.g. {missing[0]!r}): it was made for "
           "another model or kiln version")
    raise ConfigError(f"calibration cache {path} {why}; give --calib DATA to recalibrate (the cache is rewritten)")


def _calibrate(net: Network, config: BuildConfig, device, needed: set[str], source: Any,
               keep_float: set[str] = frozenset()) -> tuple[QuantScales, str]:
    data = calibration_data(source, list(net.inputs), config.calib_batch)
    readers = smoothable(net, keep_float) if config.smooth_alpha else {}
    if readers:
        data.batches = list(data.batches)  # held in memory: a second pass observes the smoothed inputs
    channels = {x: ChannelAmax() for x in readers}
    stats = collect(net, data, needed, device.torch_device, channels)
    scales = scales_from(stats, config.calibrator, config.calib_percentile)
    sha = data.sha256()
    where = f"calibrated ({config.calibrator}) on {data.samples} samples ({data.description})"
    if readers:
        smooth = {x: factors(net, x, readers[x], c.amax, config.smooth_alpha) for x, c in channels.items()}
        renamed = apply_smoothing(net, smooth, readers)
        again = CalibrationData(data.batches, description=data.description)
        scales |= scales_from(collect(net, again, set(renamed.values()), device.torch_device), config.calibrator,
                              config.calib_percentile)
        where += f"; SmoothQuant (alpha {config.smooth_alpha}) on the inputs of {sum(map(len, readers.values()))} GEMMs"
    elif config.calib_cache:
        calib_cache.CalibrationCache(config.calibrator, config.calib_percentile, sha, data.samples,
                                     scales).write(config.calib_cache)
        where += f"; written to calibration cache {config.calib_cache}"
    return QuantScales(scales), where


def find_scales(net: Network, config: BuildConfig, device, qdq: QuantScales | None,
                calib_data: Any = None, keep_float: set[str] = frozenset()) -> tuple[QuantScales | None, str]:
    """The scales to quantize `net` with and where they came from (None: there are none)."""
    if qdq is not None and (qdq.activations or qdq.weights):
        return qdq, "the model's own Q/DQ nodes (not re-calibrated)"
    cands = candidates(net).values()
    needed = {c.x for c in cands}
    # residual inputs too, so that a conv whose output is only a residual (a projection shortcut) can write it
    # quantized; optional: a cache from before they were calibrated still serves
    residuals = {c.residual for c in cands if c.residual} - needed
    source = calib_data if calib_data is not None else config.calib
    cached = None if config.smooth_alpha else _from_cache(config, needed, residuals, source is not None)
    if cached is not None:
        return cached
    if source is None:
        return None, ""
    return _calibrate(net, config, device, needed | residuals, source, keep_float)


def quantize_int8(net: Network, config: BuildConfig, device, qdq: QuantScales | None = None,
                  calib_data: Any = None, keep_float: set[str] = frozenset(),
                  validation_data: Any = None, phases: PhaseTimes | None = None) -> tuple[list[str], dict]:
    """Run the int8 (or, with --fp8, fp8) rewrite on `net` in place; (notes, build-info record). `phases` records
    the time finding scales took as "calibration" (Q/DQ, cache or calibration runs) and the accuracy budget's
    search as "accuracy budget"."""
    phases = phases if phases is not None else PhaseTimes()
    qtype = build_qtype(config)
    pinned = set(config.layer_precisions)  # --layer-precision NAME=... keeps a layer out of int8
    keep_float = set(keep_float) | {layer.name for layer in net.layers
                                    if layer.name in pinned or pinned & set(layer.origin)}
    if qtype is not INT8 and qdq is not None and (qdq.activations or qdq.weights):
        raise ConfigError("--fp8: the model has its own int8 Q/DQ nodes, which kiln honours as written; build it "
                          "with --int8 (without --fp8), or give the float model with --fp8 --calib DATA")
    with phases.phase("calibration"):
        scales, where = find_scales(net, config, device, qdq, calib_data, keep_float)
    if scales is None:
        if qtype is not INT8:
            raise ConfigError(f"--fp8 needs activation ranges: {NO_SCALES}")
        return [f"--int8: no scales, so no layer runs int8: {NO_SCALES}, or a model with Q/DQ nodes"], {}
    scales = for_qtype(scales, qtype)
    notes = ["--int8 --fp8: every quantizable layer runs fp8 (--fp8 wins); build with --int8 alone for int8 "
             "layers"] if config.int8 and config.fp8 else []
    if not config.accuracy:
        more, record = int8_rewrite(net, scales, where, keep_float, qtype)
        return notes + more, record
    source = validation_data if validation_data is not None else config.validation
    held_out = source is not None
    source = source if held_out else (calib_data if calib_data is not None else config.calib)
    if source is None:
        raise ConfigError("--accuracy needs validation data: give --validation DATA (a .npz or a folder of "
                          "NAME.npy, like --calib)")
    budget = AccuracyBudget.parse(config.accuracy)
    with phases.phase("accuracy budget"):
        feeds = validation_batches(net, source, config.calib_batch, device.torch_device)
        fallbacks, found = search(net, scales, budget, feeds, device.torch_device, keep_float, qtype=qtype)
    more, record = int8_rewrite(net, scales, where, keep_float | fallbacks, qtype)
    notes += more
    for name in found["fallbacks"]:
        record["layers"][name]["reason"] = (f"kept in float by the accuracy budget ({budget.metric} "
                                            f"{found['sensitivity'][name]:.6g} with only this layer float)")
    found["data"] = "validation data" if held_out else "the calibration data (no --validation given)"
    record["budget"] = found
    notes.append(f"accuracy budget {budget}: all-{qtype.label} {budget.metric} {found['all_int8']:.6g} on "
                 f"{found['samples']} samples of {found['data']}; "
                 + (f"{len(found['fallbacks'])} most sensitive layers kept float "
                    f"({', '.join(found['fallbacks'][:4])}{' …' if len(found['fallbacks']) > 4 else ''}) → "
                    f"{found['achieved']:.6g}" if found["fallbacks"] else f"met with every layer in {qtype.label}")
                 + ("" if found["met"] else "; NOT met even with every quantizable layer float"))
    return notes, record


def int8_rewrite(net: Network, scales: QuantScales, where: str, keep_float: set[str] = frozenset(),
                 qtype: QType = INT8):
    """apply_int8 and its report: (notes, build-info record)."""
    before = set(net.tensors)
    result = apply_int8(net, scales, keep_float, qtype)
    floats = {n: r for n, r in result.layers.items() if r["precision"] == "float"}
    notes = list(scales.notes)
    q = qtype.label
    notes.append(f"{q}: {len(result.quantized)} of {len(result.layers)} quantizable layers run {q}; scales from "
                 f"{where}{' (each amax over 448)' if qtype is not INT8 else ''}; "
                 f"{result.quantize_layers} QuantizeLinear layers inserted"
                 + (f", {result.quantized_residuals} residuals read as {q}" if result.quantized_residuals else ""))
    if floats:
        shown = "; ".join(f"{n} ({r['reason']})" for n, r in list(floats.items())[:5])
        notes.append(f"{q}: {len(floats)} layers stay float: {shown}{' …' if len(floats) > 5 else ''}")
    if scales.qdq:
        merged = sorted(n for n in scales.activations if n not in before)
        notes.append(f"int8: {len(scales.activations)} Q/DQ activation scales honoured; {result.fake_quant} float "
                     f"readers of quantized tensors read them through explicit Q→DQ layers"
                     + (f"; {len(merged)} Q/DQ points fell inside fused layers (e.g. between a conv and its ReLU) "
                        "and are applied once, at the fused layer's output" if merged else ""))
    tensors = {n: {"scale": s.scale, "source": s.source, **({"min": s.range[0], "max": s.range[1]} if s.range else {})}
               for n, s in scales.activations.items()}
    return notes, {"qtype": qtype.name, "scales_from": where, "layers": result.layers, "tensors": tensors}
