"""`kiln bench PLAN`: latency percentiles and throughput of an engine (a plan, or an .onnx built on the fly)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kiln.bench import LatencyStats, measure
from kiln.bench.profile import profile_layers
from kiln.cli.errors import command
from kiln.cli.inputs import batch_size, on_device, open_engine, random_feeds
from kiln.cli.options import Device, Json, ModelPath, Seed, Shapes, Verbose, parse_shapes
from kiln.cli.output import key_values, print_json, status, stdout
from kiln.cli.profile import ExportProfile, export_profile, print_profile


def stats_rows(stats: LatencyStats) -> list[tuple[str, str]]:
    """Latency percentiles and throughput as table rows."""
    rows = [(f"latency {k}", f"{getattr(stats, k):.3f} ms") for k in ("min", "mean", "median", "p90", "p99", "max")]
    return rows + [("throughput", f"{stats.queries_per_s:,.1f} queries/s, {stats.items_per_s:,.1f} items/s "
                                  f"(batch {stats.batch})")]


@command
def bench(
    model: ModelPath,
    iterations: Annotated[Optional[int], typer.Option(
        "--iterations", help="Timed calls to make [default: 100, or as many as --duration allows].")] = None,
    duration: Annotated[Optional[float], typer.Option(
        "--duration", help="Seconds to time for [default: up to 10]; with --iterations, the first limit reached "
                           "ends the run.")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed calls first.")] = 10,
    dump_profile: Annotated[bool, typer.Option(
        "--dump-profile", help="Also time each layer, in a separate run, and print the slowest.")] = False,
    export: ExportProfile = None,
    shapes: Shapes = None,
    seed: Seed = 0,
    device: Device = "auto",
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Time an engine on random inputs: latency min/mean/median/p90/p99/max and throughput."""
    shape_map = parse_shapes(shapes)
    engine = open_engine(model, shape_map, device)
    dev = engine.device.torch_device
    feeds = on_device(random_feeds(engine, shape_map, seed), dev)
    ctx = engine.create_context()
    status(f"timing {model.name} on {engine.device.name} ...")
    stats = measure(lambda: ctx.run(feeds), device=dev, warmup=warmup, iterations=iterations,
                    duration=duration, batch=batch_size(feeds))
    shown = {name: tuple(value.shape) for name, value in feeds.items()}
    layers = None
    if dump_profile or export:
        status("profiling each layer (a separate run) ...")
        layers = profile_layers(engine, feeds, iterations=min(stats.count, 100))
        if export:
            export_profile(layers, export)
    if as_json:
        print_json(dict(stats.to_json(), model=str(model), device_name=engine.device.name,
                        shapes={k: list(v) for k, v in shown.items()},
                        **({"profile": layers.to_json()} if dump_profile else {})))
        return
    rows = [("model", str(model)), ("device", f"{engine.device.backend}: {engine.device.name}"),
            ("inputs", ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in shown.items())),
            ("iterations", f"{stats.count} timed after {stats.warmup} warm-up")]
    stdout().print(key_values("Benchmark", rows + stats_rows(stats)))
    if dump_profile:
        print_profile(layers)
