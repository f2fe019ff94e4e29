"""Programmatic dependent launch on and off for the same engine: one build, one context per variant (each CUDA graph
captured with PDL off for some kernel modules, or with the boundary Casts left in the graph), their CUDA-graph runs
timed in alternating rounds, outputs compared.

    python -m benchmarks.probes.gpu_pdl_ab --out DIR [--rows resnet50:1,mobilenet_v2:1,...] [--rounds 5]
        [--variants on,off,layernorm,attention]

A variant is "on" (every kernel with PDL), "off" (KILN_PDL=0), "unfolded" (PDL on, the engine's boundary Casts run
inside the graph, as before stop 55) or kernel modules joined by "+" (`kiln.kernels.NAME`) whose launches go without
PDL. Writes DIR/pdl-ab.json; prints each row's medians and each variant's ratio to "on".
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import statistics
from pathlib import Path

import torch

import kiln
from benchmarks.probes.harness import alternating_ms, model_rows, rows_parser, suite_row
from kiln.runtime.boundary_casts import BoundaryCasts

ROUNDS = 5
VARIANTS = ("on", "off")


@contextlib.contextmanager
def _pdl_off(variant: str):
    """Launches inside go without PDL: all of them ("off", through KILN_PDL) or those of the named kernel modules
    (their `pdl_args` replaced for the duration)."""
    if variant in ("on", "unfolded"):
        yield
        return
    if variant == "off":
        os.environ["KILN_PDL"] = "0"
        try:
            yield
        finally:
            os.environ.pop("KILN_PDL", None)
        return
    mods = [importlib.import_module(f"kiln.kernels.{m}") for m in variant.split("+")]
    saved = [m.pdl_args for m in mods]
    for m in mods:
        m.pdl_args = lambda device: {"PDL": False}
    try:
        yield
    finally:
        for m, f in zip(mods, saved):
            m.pdl_args = f


def _context(engine, feeds: dict, variant: str):
    """A context whose CUDA graph is captured under `variant` (its launch arguments are fixed at capture)."""
    with _pdl_off(variant):
        ctx = engine.create_context()
        if variant == "unfolded":
            ctx.casts = ctx.graphs.casts = BoundaryCasts()
        out = ctx.run(feeds)
        torch.cuda.synchronize()
    return ctx, out


def ab_row(name: str, batch: int, cache: Path) -> dict:
    _, _, path, _, feeds = suite_row(name, batch, cache)
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / "pdl-timing.db"))
    engine = kiln.build(path, config)
    ctxs = {v: _context(engine, feeds, v) for v in VARIANTS}
    ref = ctxs[VARIANTS[0]][1]
    diff = {v: max(float((ref[k].float() - out[k].float()).abs().max()) for k in ref) for v, (_, out) in ctxs.items()}
    times = alternating_ms({v: functools.partial(ctx.run, feeds) for v, (ctx, _) in ctxs.items()}, ROUNDS)
    med = {v: statistics.median(t) for v, t in times.items()}
    row = {"model": name, "batch": batch, "median_ms": med, "rounds": times, "max_abs_diff": diff,
           "tactics": engine.tactic_summary(), "boundary_casts": len(engine.boundary_casts.layers)}
    if "on" in med and "off" in med:
        row |= {"pdl_on_ms": med["on"], "pdl_off_ms": med["off"], "off_over_on": med["off"] / med["on"]}
    return row


def main() -> None:
    global ROUNDS, VARIANTS
    ap = rows_parser(__doc__, "resnet50:1,mobilenet_v2:1,vit_b_16:1,bert:1,resnet50:64,mobilenet_v2:64", 300)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    ROUNDS, VARIANTS = args.rounds, tuple(args.variants.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    for r in model_rows(args, ab_row, args.out / "pdl-ab.json"):
        base = r["median_ms"].get("on")
        print(f"{r['model']} b{r['batch']}: " + ", ".join(
            f"{v} {ms:.4f} ms" + (f" ({ms / base:.3f})" if base else "") for v, ms in r["median_ms"].items())
            + f"; max |diff| {max(r['max_abs_diff'].values()):.3g}", flush=True)


if __name__ == "__main__":
    main()
