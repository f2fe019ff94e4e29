"""`kiln bench PLAN`: latency, its phases (enqueue, H2D, compute, D2H) and throughput of an engine (a plan, or an
.onnx built on the fly), with an optional per-layer profile measured in a separate run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

import kiln
from kiln.cli.errors import command
from kiln.cli.inputs import engine_and_feeds
from kiln.cli.options import (Accuracy, Bf16, Calib, CalibBatch, CalibCache, Calibrator, CalibPercentile, Device, Force,
                              Fp8, Fp16, HardwareCompatOption, InputFiles, Int8, Json, KeepIoPrecision, LayerPrecision,
                              MaxShapes, MemoryPool, MinShapes, ModelPath, OptLevel, OptShapes, Policy, Profiles, Seed,
                              Shapes, Tf32, TimingCache, Validation, Verbose, VerifyKey, parse_shapes)
from kiln.cli.options import Nvtx
from kiln.cli.options import Plugin, ShapeBuckets, SmoothAlpha, load_plugins
from kiln.cli.output import add_row, key_values, print_json, status, stdout
from kiln.cli.profile import PROFILE, ExportProfile, build_flags, export_profile, print_profile
from kiln.errors import ConfigError
from kiln.util import files

if TYPE_CHECKING:
    from kiln.bench.result import BenchResult

PHASE_LABELS = {"host": "host wall (per query)", "enqueue": "enqueue (host)", "h2d": "H2D", "compute": "compute",
                "d2h": "D2H", "gpu": "GPU total (H2D+compute+D2H)"}
TIMES = files.json_kind("kiln bench times export", "times.json", "bench-times")


def phase_table(result: BenchResult) -> Table:
    """One row per measured phase: min, mean, median, the chosen percentiles, max (ms)."""
    phases = {k: v for k, v in result.phases().items() if v}
    keys = list(next(iter(phases.values())))
    table = Table(title="Per-query phases (ms)", title_justify="left")
    table.add_column("phase")
    for k in keys:
        table.add_column(k, justify="right")
    for name, summary in phases.items():
        add_row(table, PHASE_LABELS[name], *(f"{summary[k]:.4f}" for k in keys))
    return table


def print_result(model: Path, engine: kiln.Engine, shapes: dict, result: BenchResult) -> None:
    latency = result.phases()["host"]
    rows = [("model", str(model)), ("device", f"{engine.device.backend}: {engine.device.name}"),
            ("inputs", ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in shapes.items())),
            ("iterations", f"{result.count} timed after {result.warmup} warm-up"
                           + (f", over {result.streams} streams" if result.streams > 1 else "")),
            ("settings", f"CUDA graph {'on' if result.cuda_graph else 'off'}, data transfers "
                         f"{'on' if result.data_transfers else 'off'}, {'spin' if result.spin_wait else 'blocking'} "
                         "wait")]
    rows += [(f"latency {k}", f"{v:.3f} ms") for k, v in latency.items()]
    if (first := result.first_call_text()) is not None:
        rows.append(("first call", first))
    rows += [("throughput", f"{result.queries_per_s:,.1f} queries/s, {result.items_per_s:,.1f} items/s "
                            f"(batch {result.batch})"),
             ("total host wall time", f"{result.wall_s:.3f} s")]
    gpu = result.total_gpu_s()
    if gpu is not None:
        rows.append(("total GPU time", f"{gpu:.3f} s"))
    stdout().print(key_values("Benchmark", rows))
    stdout().print(phase_table(result))
    for note in result.notes():
        typer.echo(f"note: {note}")
    for warning in result.warnings():
        typer.echo(f"warning: {warning}")


def check_outputs(times: Path | None, profile: Path | None, plot: Path | None, force: bool) -> None:
    """Refuse unwritable output paths before timing anything (kiln's write policy, kiln.util.files)."""
    from kiln.bench.plot import check_plot

    if times:
        files.check(times, TIMES, force=force, what="--export-times file")
    if profile:
        files.check(profile, PROFILE, force=force, what="--export-profile file")
    if plot:
        check_plot(plot, force)


@command
def bench(
    model: ModelPath,
    iterations: Annotated[Optional[int], typer.Option(
        "--iterations", help="Timed queries per stream, at most 10,000,000 \\[default: 100, or as many as --duration "
                              "allows].")] = None,
    duration: Annotated[Optional[float], typer.Option(
        "--duration", help="Seconds to time for, at most 86400 \\[default: up to 10]; with --iterations, the first "
                           "limit reached ends the run.")] = None,
    warmup: Annotated[int, typer.Option(
        "--warmup", help="Untimed queries first, per stream (at most 10,000,000).")] = 10,
    batch: Annotated[Optional[int], typer.Option(
        "--batch", help="Batch size: the leading dimension of every input --shapes does not give.")] = None,
    streams: Annotated[int, typer.Option(
        "--streams", help="Execution contexts, one per CUDA stream, each queried from its own thread at once; "
                          "throughput is their aggregate.")] = 1,
    cuda_graph: Annotated[Optional[bool], typer.Option(
        "--cuda-graph/--no-cuda-graph", help="Replay a captured CUDA graph per query \\[default: as built].")] = None,
    max_cuda_graphs: Annotated[int, typer.Option(
        "--max-cuda-graphs", help="Input signatures each context keeps a captured CUDA graph for (least recently "
                                  "used dropped first; 0: none).")] = 32,
    no_data_transfers: Annotated[bool, typer.Option(
        "--no-data-transfers", help="Inputs already on the device, outputs left there: time the engine alone.")
                                 ] = False,
    spin_wait: Annotated[bool, typer.Option(
        "--spin-wait", help="Poll for each query's end instead of a blocking wait (lower, steadier latency; "
                            "busy CPU).")] = False,
    percentiles: Annotated[Optional[str], typer.Option(
        "--percentiles", help="Latency percentiles to report, e.g. 90,95,99 \\[default: 90,99].")] = None,
    dump_profile: Annotated[bool, typer.Option(
        "--dump-profile", help="Also time each layer, in a separate run, and print the slowest.")] = False,
    separate_profile_run: Annotated[bool, typer.Option(
        "--separate-profile-run", help="Time each layer in a run of its own after the timed run, as "
                                       "--dump-profile does (kiln never profiles inside the headline run).")] = False,
    export_times: Annotated[Optional[Path], typer.Option(
        "--export-times", help="Write every timed query's phase times to this JSON file.")] = None,
    export: ExportProfile = None,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Draw a latency histogram (and per-layer bars with --dump-profile) into exactly this image "
                       "file, e.g. bench.png or bench.svg (PNG when it has no suffix; a directory is refused; "
                       "needs matplotlib: pip install 'kiln\\[plot]').")] = None,
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
    """Time an engine on given or random inputs: latency, its phases, throughput; warnings when the numbers
    mislead. An .onnx model is built first, with the build flags `kiln build` takes."""
    flags = build_flags(locals())
    load_plugins(plugin)
    from kiln.bench.plot import plot_bench
    from kiln.bench.profile import profile_layers
    from kiln.bench.session import BenchOptions, run_bench
    from kiln.bench.stats import parse_percentiles
    from kiln.cli.inputs import on_device

    shape_map = parse_shapes(shapes)
    if batch is not None and batch < 1:
        raise ConfigError(f"--batch must be at least 1, got {batch}")
    options = BenchOptions(iterations, duration, warmup, streams, cuda_graph, not no_data_transfers, spin_wait,
                           parse_percentiles(percentiles), nvtx=nvtx, max_cuda_graphs=max_cuda_graphs).checked()
    check_outputs(export_times, export, plot, force)
    engine, feeds, resolved = engine_and_feeds(model, inputs, shape_map, batch, device, policy, verify_key, seed,
                                               flags, cuda_graph is not False)
    first = next(iter(resolved.values()), ())
    status(f"timing {model.name} on {engine.device.name} ...")
    result = run_bench(engine, feeds, options, batch=batch or (first[0] if first else 1))
    layers = None
    if dump_profile or export or separate_profile_run:
        status("profiling each layer (a separate run) ...")
        layers = profile_layers(engine, on_device(feeds, engine.device.torch_device),
                                iterations=min(result.count, 100), nvtx=nvtx and engine.device.backend == "cuda")
        if export:
            export_profile(layers, export, force)
    if export_times:
        body = json.dumps({"kiln": "bench-times", "unit": "ms", "device": result.device, "batch": result.batch,
                           "iterations": [t.to_json() for t in result.iterations]}, indent=1) + "\n"
        files.write(export_times, body.encode(), TIMES, force=force, what="--export-times file")
    if plot:
        plot_bench(result, layers, plot, force)
    if as_json:
        print_json(dict(result.to_json(), model=str(model), device_name=engine.device.name,
                        shapes={k: list(v) for k, v in resolved.items()},
                        **({"profile": layers.to_json()} if layers is not None else {})))
        return
    print_result(model, engine, resolved, result)
    if layers is not None and (dump_profile or separate_profile_run):
        print_profile(layers)
