"""Execution-context variants of one engine: one build, one context per variant (its CUDA graph captured with PDL
off for some kernel modules, or the boundary Casts left in the graph, or replayed as before stop 55), their runs
timed in alternating rounds (CUDA events, and call + synchronize as the suite times), outputs compared.

    python -m benchmarks.probes.gpu_context_ab --out DIR [--rows resnet50:1,mobilenet_v2:1,...] [--rounds 5]
        [--variants on,off,layernorm,attention,unfolded,side_stream]

A variant is "on" (the engine as built: every kernel with PDL), "off" (KILN_PDL=0), "unfolded" (the boundary Casts
run inside the graph, as before stop 55), "side_stream" (a seen signature replays on the context's own stream behind
two event waits, inputs copied one by one, as before stop 55) or kernel modules joined by "+" (`kiln.kernels.NAME`)
whose launches go without PDL. Writes DIR/context-ab.json; prints each row's medians and each variant's ratio to
"on". (Named gpu_pdl_ab before stop 55.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import statistics
import types
from pathlib import Path

import torch

import kiln
from benchmarks.probes.harness import alternating_ms, model_rows, rows_parser, suite_row, wall_ms
from kiln.runtime.boundary_casts import BoundaryCasts

ROUNDS = 5
VARIANTS = ("on", "off")


@contextlib.contextmanager
def _pdl_off(variant: str):
    """Launches inside go without PDL: all of them ("off", through KILN_PDL) or those of the named kernel modules
    (their `pdl_args` replaced for the duration)."""
    if variant in ("on", "unfolded", "side_stream"):
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


def _side_stream_replay_seen(self, key, feeds, stream, outputs):
    """ExecutionContext._replay_seen before stop 55: the context's own stream, ordered by two event waits."""
    captured = self.graphs.runs[self._seen[key]]
    caller = torch.cuda.current_stream(self.stream.device_index)
    self.stream.wait_stream(caller)
    with torch.cuda.stream(self.stream):
        result = _one_by_one_replay(captured, feeds, {})
    caller.wait_stream(self.stream)
    return result


def _one_by_one_replay(captured, inputs, bound):
    """CapturedRun.replay with a copy launch per input, as before stop 55."""
    for k, v in inputs.items():
        captured.inputs[k].copy_(v, non_blocking=True)
    captured.graph.replay()
    to = captured.casts.outputs
    return {k: v.to(to.get(k, v.dtype), copy=True) for k, v in captured.outputs.items()}


def _context(engine, feeds: dict, variant: str):
    """A context whose CUDA graph is captured under `variant` (its launch arguments are fixed at capture)."""
    with _pdl_off(variant):
        ctx = engine.create_context()
        if variant == "unfolded":
            ctx.casts = ctx.graphs.casts = BoundaryCasts()
        if variant == "side_stream":
            ctx._replay_seen = types.MethodType(_side_stream_replay_seen, ctx)
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
    for ctx, _ in ctxs.values():
        ctx.run(feeds)  # the second run of a signature: from here on each call takes the fast path
    calls = {v: functools.partial(ctx.run, feeds) for v, (ctx, _) in ctxs.items()}
    times = alternating_ms(calls, ROUNDS)
    walls = {v: [] for v in calls}
    for _ in range(ROUNDS):
        for v, fn in calls.items():
            walls[v].append(wall_ms(fn, iters=100))
    med = {v: statistics.median(t) for v, t in times.items()}
    row = {"model": name, "batch": batch, "median_ms": med, "rounds": times, "max_abs_diff": diff,
           "wall_median_ms": {v: statistics.median(t) for v, t in walls.items()}, "wall_rounds": walls,
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
    for r in model_rows(args, ab_row, args.out / "context-ab.json"):
        base = r["median_ms"].get("on")
        print(f"{r['model']} b{r['batch']}: " + ", ".join(
            f"{v} {ms:.4f} ms" + (f" ({ms / base:.3f})" if base else "") for v, ms in r["median_ms"].items())
            + "; call + sync " + ", ".join(f"{v} {ms:.4f}" for v, ms in r["wall_median_ms"].items())
            + f"; max |diff| {max(r['max_abs_diff'].values()):.3g}", flush=True)


if __name__ == "__main__":
    main()
