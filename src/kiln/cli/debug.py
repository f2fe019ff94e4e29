"""`kiln debug precision MODEL.onnx --precision fp16`: find the layers that must stay fp32 for outputs to pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

import kiln
from kiln.cli.compare import Atol, Inputs, InputsDir, OnnxModel, Rtol, default_tolerance, feeds_for, require_model
from kiln.cli.errors import command
from kiln.cli.options import Device, Json, Seed, Shapes, Verbose, parse_shapes
from kiln.cli.output import print_json, status
from kiln.errors import ConfigError

if TYPE_CHECKING:
    from kiln.accuracy.metrics import Tolerance

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
    reduced: Annotated[str, typer.Option("--precision", help="The reduced precision to build with: fp16 or bf16.")
                       ] = "fp16",
    rtol: Rtol = None,
    atol: Atol = None,
    cosine: Annotated[Optional[float], typer.Option(
        "--cosine", help="Pass when each output's cosine similarity to fp32 is at least this, e.g. 0.999.")] = None,
    mode: Annotated[str, typer.Option("--mode", help="bisect (about log2 n builds per layer found) or linear "
                                                      "(one build per layer, pinning the worst).")] = "bisect",
    inputs: Inputs = None,
    inputs_dir: InputsDir = None,
    shapes: Shapes = None,
    seed: Seed = 0,
    device: Device = "auto",
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Build in --precision with candidate layers pinned to fp32 until the outputs match the fp32 build."""
    from kiln.accuracy.bisect import MODES, find_fp32_layers

    require_model(model)
    if reduced not in ("fp16", "bf16"):
        raise ConfigError(f"--precision {reduced!r}: choose fp16 or bf16")
    if mode not in MODES:
        raise ConfigError(f"--mode {mode!r}: choose {' or '.join(MODES)}")
    shape_map = parse_shapes(shapes)
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
    if not result.layers:
        typer.echo(f"all outputs pass ({tol}) with every eligible layer in {reduced}; nothing to pin")
        return
    typer.echo(f"{len(result.layers)} of {len(result.candidates)} {reduced} layers must stay fp32 for the outputs "
               f"to pass ({tol}); found in {len(result.builds)} builds ({mode}):")
    for name in result.layers:
        typer.echo(f"  {name}")
    typer.echo(f"build with:\n  kiln build {model} --{reduced} " + " ".join(result.flags()))
