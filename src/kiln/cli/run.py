"""`kiln run PLAN --input name=x.npy --output-dir out/`: one inference, outputs summarized and optionally saved."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from kiln.cli.errors import command
from kiln.cli.inputs import load_inputs, open_engine, output_paths, random_feeds, save_outputs
from kiln.cli.options import Device, Force, Json, ModelPath, Policy, Seed, Shapes, Verbose, VerifyKey, parse_shapes
from kiln.cli.options import Nvtx, nvtx_on
from kiln.cli.options import Plugin, load_plugins
from kiln.cli.output import add_row, print_json, stdout

if TYPE_CHECKING:
    import numpy as np


def describe(value: np.ndarray) -> dict:
    """Shape, dtype and value range of one output (no range for empty, text or complex arrays); NaN and ±Inf
    propagate as IEEE says (a NaN anywhere makes min, max and mean NaN)."""
    import numpy as np

    d = {"shape": list(value.shape), "dtype": str(value.dtype)}
    if value.size and value.dtype.kind not in "OUSc":  # ml_dtypes (bf16, fp8, int4) have kind V and cast to float
        as_f64 = value.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf in the mean: NaN, not a warning line
            d.update(min=float(as_f64.min()), max=float(as_f64.max()), mean=float(as_f64.mean()))
    return d


@command
def run(
    model: ModelPath,
    inputs: Annotated[Optional[list[str]], typer.Option(
        "--input", "-i", help="name=file.npy for one input, or file.npz for all; repeatable. "
                              "Random inputs when none is given.")] = None,
    output_dir: Annotated[Optional[Path], typer.Option(
        "--output-dir", "-o", help="Folder to write one NAME.npy per output into (an existing NAME.npy is "
                                   "replaced; another kind of file there only with --force).")] = None,
    shapes: Shapes = None,
    seed: Seed = 0,
    device: Device = "auto",
    policy: Policy = "strict",
    verify_key: VerifyKey = None,
    nvtx: Nvtx = False,
    force: Force = False,
    plugin: Plugin = None,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Run an engine once on the given (or random) inputs and summarize its outputs."""
    load_plugins(plugin)
    shape_map = parse_shapes(shapes)
    engine = open_engine(model, shape_map, device, policy, verify_key)
    feeds = load_inputs(inputs, engine) if inputs else random_feeds(engine, shape_map, seed)
    paths = output_paths([t.name for t in engine.outputs], output_dir, force) if output_dir else None
    outputs = engine.create_context(nvtx=nvtx_on(nvtx, engine)).run(feeds)
    files = save_outputs(outputs, paths, force) if paths else {}
    rows = {name: dict(describe(value), file=str(files[name]) if name in files else None)
            for name, value in outputs.items()}
    if as_json:
        print_json(rows)
        return
    table = Table(title="Outputs", title_justify="left")
    for col in ("output", "shape", "dtype", "min", "max", "mean", "file"):
        table.add_column(col, overflow="fold")
    for name, r in rows.items():
        stats = [f"{r[k]:.6g}" if k in r else "-" for k in ("min", "max", "mean")]
        add_row(table, name, "x".join(map(str, r["shape"])) or "scalar", r["dtype"], *stats, r["file"] or "")
    stdout().print(table)
