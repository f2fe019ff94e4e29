"""Programmatic dependent launch on and off for the same engine: one build, two contexts (one captured with
KILN_PDL=1, one with KILN_PDL=0), their CUDA-graph runs timed in alternating rounds, outputs compared.

    python -m benchmarks.probes.gpu_pdl_ab --out DIR [--rows resnet50:1,mobilenet_v2:1,...] [--rounds 5]

Writes DIR/pdl-ab.json; prints each row's medians and the ratio off ÷ on.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import torch

import kiln
from benchmarks.probes.harness import event_ms, model_rows, rows_parser, suite_row

ROUNDS = 5


def _context(engine, feeds: dict, pdl: str):
    """A context whose CUDA graph is captured with KILN_PDL=`pdl` (kernels/common.pdl_args reads it at launch)."""
    os.environ["KILN_PDL"] = pdl
    try:
        ctx = engine.create_context()
        out = ctx.run(feeds)
        torch.cuda.synchronize()
    finally:
        os.environ.pop("KILN_PDL", None)
    return ctx, out


def ab_row(name: str, batch: int, cache: Path) -> dict:
    _, _, path, _, feeds = suite_row(name, batch, cache)
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / "pdl-timing.db"))
    engine = kiln.build(path, config)
    ctxs = {pdl: _context(engine, feeds, pdl) for pdl in ("1", "0")}
    on, off = ctxs["1"][1], ctxs["0"][1]
    diff = max(float((on[k].float() - off[k].float()).abs().max()) for k in on)
    times: dict[str, list[float]] = {"1": [], "0": []}
    for _ in range(ROUNDS):
        for pdl, (ctx, _) in ctxs.items():
            times[pdl].append(event_ms(lambda: ctx.run(feeds), iters=100, warmup=10))
    on_ms, off_ms = statistics.median(times["1"]), statistics.median(times["0"])
    return {"model": name, "batch": batch, "pdl_on_ms": on_ms, "pdl_off_ms": off_ms, "off_over_on": off_ms / on_ms,
            "rounds": times, "max_abs_diff": diff}


def main() -> None:
    global ROUNDS
    ap = rows_parser(__doc__, "resnet50:1,mobilenet_v2:1,vit_b_16:1,bert:1,resnet50:64,mobilenet_v2:64", 300)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args()
    ROUNDS = args.rounds
    args.out.mkdir(parents=True, exist_ok=True)
    for r in model_rows(args, ab_row, args.out / "pdl-ab.json"):
        if "pdl_on_ms" in r:
            print(f"{r['model']} b{r['batch']}: PDL on {r['pdl_on_ms']:.4f} ms, off {r['pdl_off_ms']:.4f} ms, "
                  f"off/on {r['off_over_on']:.3f}, max |diff| {r['max_abs_diff']:.3g}")


if __name__ == "__main__":
    main()
