"""`kiln debug precision MODEL.onnx --precision fp16`: find the layers that must stay fp32 for outputs to pass;
`--precision int8 --calib DATA`: each quantizable layer's error alone in int8, then the layers to keep float."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

import kiln
from kiln.cli.compare import Atol, Inputs, InputsDir, OnnxModel, Rtol, default_tolerance, feeds_for, require_model
from kiln.cli.errors import command
from kiln.cli.options import Calib, Calibrator, Device, Json, Seed, Shapes, SmoothAlpha, Verbose, parse_shapes
from kiln.cli.output import add_row, print_json, status, stdout
from kiln.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from kiln.accuracy.int8_layers import Int8Report
    from kiln.accuracy.metrics import Tolerance

INT8_COSINE = 0.99  # the int8 mode's default tolerance: cosine similarity of each output to fp32

app = typer.Typer(help="Find why an engine's outputs differ: precision problems layer by layer.",
                  no_args_is_help=True)


def search_tolerance(config: kiln.BuildConfig, rtol: float | None, atol: float | None,
                     cosine: float | None) -> Tolerance:
    """--cosine alone, or --rtol/--atol (defaulting to the precision's tolerance)."""
    from kiln.accuracy.metrics import Tolerance

    if cosine is None:
        return default_tolerance(config, rtol, atol)
    if rtol is not None or atol is not None:
        raise ConfigError("give --cosine or --rtol/--atol, not both")
    if not 0 < cosine <= 1:
        raise ConfigError(f"--cosine must be in (0, 1], e.g. 0.999; got {cosine}")
    return Tolerance(0.0, 0.0, cosine)


@app.command("precision")
@command
def precision(
    model: OnnxModel,
    reduced: Annotated[str, typer.Option("--precision", help="The reduced precision to build with: fp16, bf16 or int8 "
                                                     "(with --calib).")
                       ] = "fp16",
    rtol: Rtol = None,
    atol: Atol = None,
    cosine: Annotated[Optional[float], typer.Option(
        "--cosine", help="Pass when each output's cosine similarity to fp32 is at least this, e.g. 0.999.")] = None,
    mode: Annotated[str, typer.Option("--mode", help="bisect (about log2 n builds per layer found) or linear "
                                                      "(one build per layer, pinning the worst).")] = "bisect",
    calib: Calib = None,
    calibrator: Calibrator = "entropy",
    smooth_alpha: SmoothAlpha = 0.0,
    inputs: Inputs = None,
    inputs_dir: InputsDir = None,
    shapes: Shapes = None,
    seed: Seed = 0,
    device: Device = "auto",
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Build in --precision with candidate layers pinned to fp32 until the outputs match the fp32 build
    (int8: first each quantizable layer's error alone in int8, worst first)."""
    from kiln.accuracy.bisect import MODES, find_fp32_layers

    require_model(model)
    if reduced not in ("fp16", "bf16", "int8"):
        raise ConfigError(f"--precision {reduced!r}: choose fp16, bf16 or int8")
    if mode not in MODES:
        raise ConfigError(f"--mode {mode!r}: choose {' or '.join(MODES)}")
    shape_map = parse_shapes(shapes)
    if reduced == "int8":
        return int8_precision(model, calib, calibrator, smooth_alpha, rtol, atol, cosine, mode, inputs, inputs_dir,
                              shape_map, seed, device, as_json)
    given = [f for f, on in (("--calib", calib), ("--calibrator", calibrator != "entropy"),
                             ("--smooth-alpha", smooth_alpha)) if on]
    if given:
        raise ConfigError(f"{' and '.join(given)} only apply to --precision int8")
    config = kiln.BuildConfig.with_shapes(shape_map, device=device, **{reduced: True})
    tol = search_tolerance(config, rtol, atol, cosine)
    status(f"building {model.name} in fp32 for the reference ...")
    fp32 = kiln.build(model, kiln.BuildConfig.with_shapes(shape_map, device=device))
    feeds = feeds_for(fp32, inputs, inputs_dir, shape_map, seed)
    result = find_fp32_layers(model, config, fp32, feeds, tol, mode, log=status)
    if as_json:
        print_json({"precision": reduced, "mode": mode, "tolerance": str(tol), "fp32_layers": result.layers,
                    "flags": result.flags(), "candidates": len(result.candidates),
                    "builds": [{"fp32_layers": p, "passed": ok} for p, ok in result.builds],
                    "outputs": {n: m.to_json() for n, m in result.outputs.items()}})
        return
    print_pins(result, f"every eligible layer in {reduced}; nothing to pin", f"{reduced} layers must stay fp32",
               str(tol), mode, f"kiln build {model} --{reduced}")


def int8_precision(model: Path, calib: Path | None, calibrator: str, smooth_alpha: float, rtol: float | None,
                   atol: float | None, cosine: float | None, mode: str, inputs, inputs_dir, shape_map, seed: int,
                   device: str, as_json: bool) -> None:
    """--precision int8: per-layer errors (a table, worst first) and the --layer-precision flags that pass."""
    from kiln.accuracy.int8_layers import int8_layer_errors

    if calib is None:
        raise ConfigError("--precision int8 needs calibration data: give --calib DATA (a .npz or a folder of "
                          "NAME.npy, samples along axis 0)")
    if not calib.exists():
        raise ConfigError(f"--calib {calib} does not exist")
    config = kiln.BuildConfig.with_shapes(shape_map, device=device, int8=True, calib=str(calib),
                                          calibrator=calibrator, smooth_alpha=smooth_alpha)
    tol = search_tolerance(config, rtol, atol, INT8_COSINE if cosine is None and rtol is None and atol is None
                           else cosine)
    status(f"building {model.name} in fp32 for the reference ...")
    fp32 = kiln.build(model, kiln.BuildConfig.with_shapes(shape_map, device=device))
    feeds = feeds_for(fp32, inputs, inputs_dir, shape_map, seed) if inputs or inputs_dir else None
    report = int8_layer_errors(model, config, fp32, tol, feeds, mode, log=status)
    build = f"kiln build {model} --int8 --calib {calib}" + (f" --calibrator {calibrator}" if calibrator != "entropy"
                                                             else "") + \
        (f" --smooth-alpha {smooth_alpha:g}" if smooth_alpha else "")
    result = report.search
    if as_json:
        print_json({"precision": "int8", "mode": mode, "tolerance": str(tol), "calibrator": calibrator,
                    "smooth_alpha": smooth_alpha, "scales_from": report.scales_from,
                    "calibrations": report.calibrations, "samples": report.samples,
                    "all_int8": report.all_int8.to_json(), "layers": [e.to_json() for e in report.layers],
                    "fp32_layers": result.layers, "flags": result.flags(), "candidates": len(result.candidates),
                    "builds": len(result.builds), "command": " ".join([build, *result.flags()]),
                    "outputs": {n: m.to_json() for n, m in result.outputs.items()}})
        return
    print_int8_table(report, str(tol))
    print_pins(result, "every quantizable layer in int8; nothing to keep float", "int8 layers must stay float",
               str(tol), f"{mode}, worst first", build)


def print_pins(result, none: str, what: str, tol: str, mode: str, build: str) -> None:
    """The layers the search pinned and the build command that pins them (or that `none` needed pinning)."""
    if not result.layers:
        typer.echo(f"all outputs pass ({tol}) with {none}")
        return
    typer.echo(f"{len(result.layers)} of {len(result.candidates)} {what} for the outputs to pass ({tol}); found in "
               f"{len(result.builds)} builds ({mode}):")
    for name in result.layers:
        typer.echo(f"  {name}")
    typer.echo("build with:\n  " + " ".join([build, *result.flags()]))


def print_int8_table(report: Int8Report, tol: str) -> None:
    """The per-layer table, worst first, and the all-int8 build's row."""
    from rich.table import Table

    top1 = any(e.top1 is not None for e in report.layers)
    table = Table(title=f"int8 error per layer, that layer alone in int8 (vs fp32, {report.samples} samples; "
                        f"pass: {tol})", title_justify="left")
    for col in ["#", "layer", "kind", "cosine", "max-rel", *(["top-1 agree"] if top1 else []), "pass"]:
        table.add_column(col, justify="right" if col in ("#", "cosine", "max-rel", "top-1 agree") else "left")

    def row(rank, e):
        cells = [rank, e.name, e.kind, f"{e.cosine:.6f}", f"{e.max_rel:.3g}"]
        cells += [f"{e.top1:.1%}" if e.top1 is not None else "-"] if top1 else []
        add_row(table, *cells, "yes" if e.passed else "NO")

    for i, e in enumerate(report.layers):
        row(i + 1, e)
    row("", report.all_int8)
    stdout().print(table)
    typer.echo(f"scales: {report.scales_from} (calibrated {report.calibrations}x, reused by every build)")
