"""`kiln build MODEL.onnx -o MODEL.plan`: build an engine, show progress and a build summary."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

import kiln
from kiln.cli.errors import command
from kiln.cli.options import (Accuracy, Bf16, Calib, CalibBatch, CalibCache, Calibrator, CalibPercentile, Device, Force,
                              Fp8, Fp16, HardwareCompatOption, Int8, Json, KeepIoPrecision, LayerPrecision, MaxShapes,
                              MemoryPool, MinShapes, OptLevel, OptShapes, Profiles, ShapeBuckets, Shapes, SignKey,
                              SmoothAlpha, Tf32, TimingCache, Validation, Verbose, parse_memory_pools, parse_shapes)
from kiln.cli.options import Plugin, load_plugins
from kiln.cli.output import add_row, build_progress, fmt_arena, fmt_bytes, key_values, print_json, stdout
from kiln.config import Profile, ShapeRange
from kiln.errors import ConfigError, InternalError
from kiln.util import files

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def qtypes_by_label() -> dict:
    """int8 / fp8 quantized types by label ("int8", "fp8")."""
    from kiln.kinds.qtype import QTYPES

    return {q.label: q for q in QTYPES.values()}


def profile_from(shapes: dict, min_shapes: dict, opt_shapes: dict, max_shapes: dict,
                 profiles: list | tuple = ()) -> tuple[Profile, ...]:
    """The optimization profiles: --min/--max-shapes (and --opt-shapes, default max) one, the first; each --profile
    MIN OPT MAX one more; inputs --shapes fixes are in every profile."""
    if set(min_shapes) != set(max_shapes) or not set(opt_shapes) <= set(min_shapes):
        raise ConfigError("--min-shapes and --max-shapes must name the same inputs, and --opt-shapes only those")
    ranged = [{n: ShapeRange(min_shapes[n], opt_shapes.get(n, max_shapes[n]), max_shapes[n]) for n in min_shapes}]
    ranged = (ranged if min_shapes else []) + [_profile_option(spec) for spec in profiles or ()]
    for k, p in enumerate(ranged[1:], 1):
        if set(p) != set(ranged[0]):
            raise ConfigError(f"profile {k} ranges inputs {sorted(p)} but profile 0 ranges {sorted(ranged[0])}; "
                              "every --profile (and --min/--max-shapes) must give the same inputs")
    both = sorted(set(shapes) & set(ranged[0])) if ranged else []
    if both:
        raise ConfigError(f"{both} given both in --shapes and in --profile or --min/--max-shapes; use one of them "
                          "per input")
    fixed = {n: ShapeRange.fixed(s) for n, s in shapes.items()}
    return tuple({**p, **fixed} for p in ranged) or ((fixed,) if fixed else ())


def _profile_option(spec) -> Profile:
    """One --profile MIN OPT MAX (each name:1x16[,name2:...]) as {input: ShapeRange}, or a ConfigError."""
    if isinstance(spec, str) or not isinstance(spec, (tuple, list)) or len(spec) != 3:
        raise ConfigError(f"--profile {spec!r} is not three shape lists; write --profile MIN OPT MAX, e.g. "
                          "--profile x:1x16 x:8x128 x:32x512")
    option = "--profile " + " ".join(map(str, spec))
    lo, opt, hi = (parse_shapes([str(s)], option) for s in spec)
    if not set(lo) == set(opt) == set(hi):
        raise ConfigError(f"{option}: MIN, OPT and MAX must name the same inputs (they name {sorted(lo)}, "
                          f"{sorted(opt)} and {sorted(hi)})")
    try:
        return {n: ShapeRange(lo[n], opt[n], hi[n]) for n in lo}
    except ConfigError as e:
        raise ConfigError(f"{option}: {e}") from None


def parse_layer_precisions(specs: list[str] | None) -> dict[str, str]:
    """`["conv1=fp32"]` → `{"conv1": "fp32"}`."""
    out = {}
    for spec in specs or ():
        name, sep, precision = spec.rpartition("=")
        if not sep or not name or precision not in PRECISIONS:
            raise ConfigError(f"--layer-precision {spec!r} is not NAME=PRECISION with PRECISION one of "
                              f"{', '.join(PRECISIONS)}; e.g. --layer-precision conv1=fp32")
        out[name] = precision
    return out


def _seconds(v) -> float | None:
    """`v` if it is a finite, non-negative number of seconds (a plan's build info is data from a file), else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 \
        else None


def build_time(info: dict, after: dict[str, float] | None = None) -> dict | None:
    """Where the build's time went, from its build info ("build_phases", "build_counts", "build_seconds"; None for a
    plan from before they were recorded): {"phases": {phase: s}, "counts": {what: n}, "total_seconds",
    "unaccounted_seconds"}. `after`: phases after `kiln.build` returned (warm-up, save), added to phases and total."""
    phases, total = info.get("build_phases"), _seconds(info.get("build_seconds"))
    if not isinstance(phases, dict) or total is None:
        return None
    seconds = {str(k): _seconds(v) for k, v in phases.items()}
    seconds = {k: v for k, v in seconds.items() if v is not None}
    warm_up = _seconds(info.get("warm_up_seconds"))
    later = {**({"warm-up": warm_up} if warm_up else {}), **(after or {})}
    counts = info.get("build_counts") if isinstance(info.get("build_counts"), dict) else {}
    busy = info.get("build_check_seconds") if isinstance(info.get("build_check_seconds"), dict) else {}
    busy = {str(k): _seconds(v) for k, v in busy.items()}
    return {"phases": seconds | later,
            "counts": {str(k): v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)},
            "check_seconds_by_tactic": dict(sorted(((k, v) for k, v in busy.items() if v is not None),
                                                   key=lambda kv: -kv[1])),
            "total_seconds": total + sum(later.values()),
            "unaccounted_seconds": max(0.0, total - sum(seconds.values()))}


def build_time_table(t: dict) -> Table:
    """The "Build time" table: each phase's seconds and share of the total, then the autotuner's counts and the
    tactics whose candidates took the most compile + check time (thread-seconds: threads overlap)."""
    busy = ", ".join(f"{k} {s:.1f}" for k, s in list(t.get("check_seconds_by_tactic", {}).items())[:5])
    caption = [", ".join(f"{k}: {n}" for k, n in t["counts"].items()),
               f"compile + check by tactic, thread-seconds: {busy}" if busy else ""]
    table = Table(title="Build time", title_justify="left", caption_justify="left",
                  caption="\n".join(c for c in caption if c) or None)
    for col in ("phase", "seconds", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    total = t["total_seconds"]
    share = lambda s: f"{100 * s / total:.1f}%" if total > 0 else "-"  # noqa: E731
    for phase, s in [*t["phases"].items(), ("(unaccounted)", t["unaccounted_seconds"])]:
        add_row(table, phase, f"{s:.3f}", share(s))
    add_row(table, "total", f"{total:.3f}", share(total))
    return table


def summary(engine: kiln.Engine, plan: Path, save_seconds: float | None = None) -> dict:
    """What the build did, for the table and --json; `save_seconds`: how long writing the plan took."""
    info = engine.build_info
    return {"plan": str(plan), "plan_bytes": plan.stat().st_size, "device": engine.device.name,
            "backend": engine.device.backend, "onnx_nodes": info.get("onnx_nodes"),
            "imported_layers": info.get("imported_layers"), "layers": info.get("layers"),
            "passes": info.get("passes", {}), "weight_bytes": engine.network.weight_bytes(),
            "arena_bytes": engine.memory_plan.arena_bytes, "arena": fmt_arena(engine.memory_plan.to_json()),
            "stage_seconds": info.get("stage_seconds", {}),
            "build_seconds": info.get("build_seconds"), "notes": info.get("notes", []),
            "profiles": engine.config.to_json()["profiles"],
            "build_time": build_time(info, None if save_seconds is None else {"save": save_seconds}),
            **(_quant_summary(info) if info.get("int8") else {})}


def _quant_summary(info: dict) -> dict:
    """The int8 / fp8 rewrite's summary, under the key "int8" or "fp8" (the precision its layers run in)."""
    from kiln.quant.report import int8_summary

    q = int8_summary(info)
    return {q["precision"]: q}


def print_summary(s: dict) -> None:
    passes = ", ".join(f"{name} ×{n}" for name, n in s["passes"].items()) or "none changed the network"
    rows = [("plan", f"{s['plan']} ({fmt_bytes(s['plan_bytes'])})"), ("device", f"{s['backend']}: {s['device']}"),
            ("ONNX nodes → layers", f"{s['onnx_nodes']} → {s['layers']} (imported as {s['imported_layers']})"),
            ("passes applied", passes), ("weights", fmt_bytes(s["weight_bytes"])),
            ("activation arena", s["arena"])]
    if not s.get("build_time"):
        rows += [(f"time: {stage}", f"{sec:.3f} s") for stage, sec in s["stage_seconds"].items()]
        rows.append(("time: total", f"{s['build_seconds']:.3f} s"))
    from kiln.quant.report import ranges_table

    by_label = qtypes_by_label()
    quant = next((s[k] for k in by_label if k in s), None)
    if quant:
        label = quant["precision"]
        rows.append((f"{label} layers", f"{quant['quantized_layers']} of {quant['quantizable_layers']} quantizable "
                                        f"layers; scales from {quant['scales_from']}"))
    rows += [("note", note) for note in s["notes"]]
    stdout().print(key_values("Build summary", rows))
    if s.get("build_time"):
        stdout().print(build_time_table(s["build_time"]))
    if quant and quant["ranges"]:
        stdout().print(ranges_table(quant["ranges"], by_label[quant["precision"]]))


BUILD_DEFAULTS = dict(fp16=False, bf16=False, int8=False, fp8=False, tf32=False, min_shapes=None, opt_shapes=None,
                      max_shapes=None, profile=None, shape_buckets=1, timing_cache=None, opt_level=3,
                      layer_precision=None, keep_io_precision=True, memory_pool=None, hardware_compat="none",
                      calib=None, calibrator="entropy", calib_cache=None, calib_batch=16, calib_percentile=99.99,
                      smooth_alpha=0.0, accuracy=None, validation=None)


def build_flags_given(flags: dict) -> list[str]:
    """The build flags among `flags` (keys of BUILD_DEFAULTS) set to other than their default, as --options."""
    return ["--" + k.replace("_", "-") for k, v in flags.items() if k in BUILD_DEFAULTS and v != BUILD_DEFAULTS[k]]


def build_config(shapes: dict[str, tuple[int, ...]], device: str, cuda_graph: bool = True, **flags) -> kiln.BuildConfig:
    """The BuildConfig of the build flags (options.py; defaults in BUILD_DEFAULTS) that `kiln build` and, on an
    .onnx, `kiln bench` / `kiln profile` take; --shapes fix inputs, --profile and --min/--opt/--max-shapes range
    them."""
    unknown = sorted(set(flags) - set(BUILD_DEFAULTS))
    if unknown:
        raise InternalError(f"build_config got unknown flags {unknown}")
    f = {**BUILD_DEFAULTS, **flags}
    if f["calib_cache"]:  # its reader refuses other files
        from kiln.quant.calib_cache import KIND as calib_kind

        files.check(f["calib_cache"], calib_kind, force=True, what="calibration cache")
    profiles = profile_from(shapes, parse_shapes(f["min_shapes"], "--min-shapes"),
                            parse_shapes(f["opt_shapes"], "--opt-shapes"),
                            parse_shapes(f["max_shapes"], "--max-shapes"), f["profile"])
    path = lambda p: str(p) if p else None  # noqa: E731
    return kiln.BuildConfig(fp16=f["fp16"], bf16=f["bf16"], int8=f["int8"], fp8=f["fp8"], tf32=f["tf32"],
                            profiles=profiles, timing_cache=path(f["timing_cache"]), opt_level=f["opt_level"],
                            device=device, layer_precisions=parse_layer_precisions(f["layer_precision"]),
                            keep_io_precision=f["keep_io_precision"], cuda_graph=cuda_graph,
                            workspace_bytes=parse_memory_pools(f["memory_pool"]).get("workspace"),
                            hardware_compat=f["hardware_compat"], calib=path(f["calib"]), calibrator=f["calibrator"],
                            calib_cache=path(f["calib_cache"]), calib_batch=f["calib_batch"],
                            calib_percentile=f["calib_percentile"], smooth_alpha=f["smooth_alpha"],
                            accuracy=f["accuracy"],
                            validation=path(f["validation"]), shape_buckets=f["shape_buckets"])


@command
def build(
    model: Annotated[Path, typer.Argument(help="The ONNX model to build.", show_default=False)],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Plan file to write [default: MODEL.plan]")
                      ] = None,
    fp16: Fp16 = False,
    bf16: Bf16 = False,
    int8: Int8 = False,
    fp8: Fp8 = False,
    tf32: Tf32 = False,
    shapes: Shapes = None,
    min_shapes: MinShapes = None,
    opt_shapes: OptShapes = None,
    max_shapes: MaxShapes = None,
    profile: Profiles = None,
    shape_buckets: ShapeBuckets = 1,
    timing_cache: TimingCache = None,
    opt_level: OptLevel = 3,
    device: Device = "auto",
    layer_precision: LayerPrecision = None,
    keep_io_precision: KeepIoPrecision = True,
    memory_pool: MemoryPool = None,
    cuda_graph: Annotated[bool, typer.Option(
        "--cuda-graph/--no-cuda-graph", help="Capture the whole engine in a CUDA graph per input shape.")] = True,
    hardware_compat: HardwareCompatOption = "none",
    calib: Calib = None,
    calibrator: Calibrator = "entropy",
    calib_cache: CalibCache = None,
    calib_batch: CalibBatch = 16,
    calib_percentile: CalibPercentile = 99.99,
    smooth_alpha: SmoothAlpha = 0.0,
    accuracy: Accuracy = None,
    validation: Validation = None,
    sign_key: SignKey = None,
    force: Force = False,
    plugin: Plugin = None,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Build an engine from an ONNX model and save it as a plan file."""
    load_plugins(plugin)
    from kiln.engine.plan import KIND
    from kiln.engine.signing import load_private_key

    plan = output or model.with_suffix(".plan")
    if plan.resolve() == model.resolve():
        raise ConfigError(f"the plan would overwrite the model {model}; name another file with -o")
    files.check(plan, KIND, force=force, what="plan file")  # before the build, not after it
    config = build_config(parse_shapes(shapes), device, cuda_graph, fp16=fp16, bf16=bf16, int8=int8, fp8=fp8,
                          tf32=tf32, min_shapes=min_shapes, opt_shapes=opt_shapes, max_shapes=max_shapes,
                          profile=profile, shape_buckets=shape_buckets, timing_cache=timing_cache,
                          opt_level=opt_level,
                          layer_precision=layer_precision, keep_io_precision=keep_io_precision, memory_pool=memory_pool,
                          hardware_compat=hardware_compat, calib=calib, calibrator=calibrator,
                          calib_cache=calib_cache, calib_batch=calib_batch, calib_percentile=calib_percentile,
                          smooth_alpha=smooth_alpha, accuracy=accuracy, validation=validation)
    key = load_private_key(sign_key) if sign_key else None  # a bad key fails before the build, not after
    with build_progress(f"building {model.name}") as progress:
        engine = kiln.build(model, config, progress=progress)
    start = time.perf_counter()
    engine.save(plan, sign_key=key, force=force)
    s = summary(engine, plan, time.perf_counter() - start)
    if as_json:
        print_json(s)
    else:
        print_summary(s)
