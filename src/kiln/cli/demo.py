"""`kiln demo`: build kiln's own demo models for the best device present and print a benchmark summary."""

from __future__ import annotations

from rich import box
from rich.table import Table

from kiln.cli.errors import command
from kiln.cli.options import Device, Json, Verbose
from kiln.cli.output import add_row, print_json, status, stdout


@command
def demo(device: Device = "auto", verbose: Verbose = False, as_json: Json = False) -> None:
    """Make a small CNN and a small transformer encoder, build them, check them against torch, time them."""
    from kiln.demo import cache_dir, run_demo

    results = run_demo(device, report=lambda message: status(f"demo: {message}"))
    if as_json:
        print_json([{"model": r.name, "plan": str(r.plan), "device": r.device, "input_shape": list(r.input_shape),
                     "onnx_nodes": r.onnx_nodes, "layers": r.layers, "build_seconds": r.build_seconds,
                     "max_abs_diff_vs_torch": r.max_abs_diff, "bench": r.stats.to_json()} for r in results])
        return
    table = Table(title=f"kiln demo on {results[0].device}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for col in ("model", "input", "layers", "max |Δ|", "median", "p99", "items/s"):
        table.add_column(col, overflow="fold")
    for r in results:
        s = r.stats
        add_row(table, r.name, "x".join(map(str, r.input_shape)), f"{r.onnx_nodes} → {r.layers}",
                f"{r.max_abs_diff:.0e}", f"{s.median:.2f} ms", f"{s.p99:.2f} ms", f"{s.items_per_s:,.0f}")
    out = stdout()
    out.print(table)
    out.print("layers: ONNX nodes → kiln layers; max |Δ|: largest difference from torch's output", markup=False)
    out.print(f"Models and plans are in {cache_dir()}; look inside one with `kiln inspect {results[0].plan}`.",
              markup=False, soft_wrap=True)
