"""`kiln profile PLAN`: each layer's kernel time (also `kiln bench --dump-profile / --export-profile FILE`); an .onnx
model is built first, with every build flag `kiln build` (and `kiln bench`) takes."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.table import Table

from kiln.cli.errors import command
from kiln.cli.inputs import engine_and_feeds
from kiln.cli.options import (Accuracy, Bf16, Calib, CalibBatch, CalibCache, Calibrator, CalibPercentile, Device, Force,
                              Fp8, Fp16, HardwareCompatOption, InputFiles, Int8, Json, KeepIoPrecision, LayerPrecision,
                              MaxShapes, MemoryPool, MinShapes, ModelPath, OptLevel, OptShapes, Policy, Profiles, Seed,
                              Shapes, Tf32, TimingCache, Validation, Verbose, VerifyKey, parse_shapes)
from kiln.cli.options import Nvtx, nvtx_on
from kiln.cli.options import Plugin, ShapeBuckets, SmoothAlpha, load_plugins
from kiln.cli.output import add_row, print_json, status, stdout
from kiln.util import files

if TYPE_CHECKING:
    from kiln.bench.profile import LayerProfile

TOP = 30

ExportProfile = Annotated[Optional[Path], typer.Option(
    "--export-profile", help="Write the per-layer profile to this JSON file.")]
PROFILE = files.json_kind("kiln layer profile", "profile.json", "layer-profile")


def build_flags(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The build flags (`kiln build`'s options, kiln.cli.build.BUILD_DEFAULTS) among a command's arguments, e.g. its
    `locals()`: what `bench` and `profile` pass to engine_and_feeds, which builds an .onnx with them and refuses
    them with a plan."""
    from kiln.cli.build import BUILD_DEFAULTS

    return {k: arguments[k] for k in BUILD_DEFAULTS if k in arguments}


def print_profile(profile: LayerProfile, top: int = TOP) -> None:
    """The slowest `top` layers by mean time, then one row for all the others."""
    table = Table(title=f"Per-layer profile ({profile.iterations} iterations, {profile.device}; a separate run, "
                        "each layer timed alone, eagerly)", title_justify="left")
    for col in ("layer", "kind", "precision", "tactic", "time ms", "mean ms", "median ms", "%"):
        table.add_column(col, overflow="fold", justify="right" if col.endswith(("ms", "%")) else "left")
    ranked = profile.ranked()
    for t in ranked[:top]:
        add_row(table, t.name, t.kind, t.precision, t.tactic, f"{t.total:.4f}", f"{t.mean:.4f}",
                f"{t.median:.4f}", f"{profile.percent(t.mean):.1f}")
    rest = ranked[top:]
    if rest:
        mean = sum(t.mean for t in rest)
        add_row(table, f"other ({len(rest)} layers)", "", "", "", f"{sum(t.total for t in rest):.4f}",
                f"{mean:.4f}", f"{sum(t.median for t in rest):.4f}", f"{profile.percent(mean):.1f}")
    add_row(table, "total", "", "", "", f"{sum(t.total for t in ranked):.4f}", f"{profile.total_ms:.4f}", "",
            "100.0")
    stdout().print(table)


def export_profile(profile: LayerProfile, path: Path, force: bool = False) -> None:
    """--export-profile: the profile as JSON, first key "kiln": "layer-profile" (kiln's write policy)."""
    body = json.dumps({"kiln": "layer-profile", **profile.to_json()}, indent=2) + "\n"
    files.write(path, body.encode(), PROFILE, force=force, what="--export-profile file")


@command
def profile(
    model: ModelPath,
    iterations: Annotated[int, typer.Option("--iterations", help="Profiled passes over the engine.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed passes first.")] = 2,
    export: ExportProfile = None,
    inputs: InputFiles = None,
    shapes: Shapes = None,
    seed: Seed = 0,
    device: Device = "auto",
    policy: Policy = "strict",
    verify_key: VerifyKey = None,
    fp16: Fp16 = False,
    bf16: Bf16 = False,
    int8: Int8 = False,
    fp8: Fp8 = False,
    tf32: Tf32 = False,
    min_shapes: MinShapes = None,
    opt_shapes: OptShapes = None,
    max_shapes: MaxShapes = None,
    profile: Profiles = None,
    shape_buckets: ShapeBuckets = 1,
    timing_cache: TimingCache = None,
    opt_level: OptLevel = 3,
    layer_precision: LayerPrecision = None,
    keep_io_precision: KeepIoPrecision = True,
    memory_pool: MemoryPool = None,
    hardware_compat: HardwareCompatOption = "none",
    calib: Calib = None,
    calibrator: Calibrator = "entropy",
    calib_cache: CalibCache = None,
    calib_batch: CalibBatch = 16,
    calib_percentile: CalibPercentile = 99.99,
    smooth_alpha: SmoothAlpha = 0.0,
    accuracy: Accuracy = None,
    validation: Validation = None,
    nvtx: Nvtx = False,
    force: Force = False,
    plugin: Plugin = None,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Time each layer's kernel on given or random inputs: mean/median per layer, slowest first. An .onnx model is
    built first, with the build flags `kiln build` takes (a plan is built already: build flags with one are an
    error)."""
    flags = build_flags(locals())
    load_plugins(plugin)
    from kiln.bench.profile import profile_layers
    from kiln.cli.inputs import on_device

    shape_map = parse_shapes(shapes)
    if export:
        files.check(export, PROFILE, force=force, what="--export-profile file")
    engine, feeds, _ = engine_and_feeds(model, inputs, shape_map, None, device, policy, verify_key, seed, flags)
    feeds = on_device(feeds, engine.device.torch_device)
    status(f"profiling {model.name} on {engine.device.name} ...")
    result = profile_layers(engine, feeds, iterations, warmup, nvtx=nvtx_on(nvtx, engine))
    if export:
        export_profile(result, export, force)
    if as_json:
        print_json(result.to_json())
    else:
        print_profile(result)
