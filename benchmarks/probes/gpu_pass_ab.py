"""One model built with and without a pass: the build without it first, then with it on the same timing cache (the
layers the pass leaves alone keep their timed choices), their CUDA-graph runs timed in alternating rounds, outputs
compared.

    python -m benchmarks.probes.gpu_pass_ab --out DIR --pass attention_keep_mask [--rows bert:1,minilm:1] [--rounds 5]

Writes DIR/pass-ab.json; prints each row's medians, the ratio without ÷ with, and both engines' layer counts.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import warnings
from pathlib import Path

import torch

import kiln
from benchmarks.probes.harness import alternating_ms, model_rows, rows_parser, suite_row
from kiln.quant import pipeline

ROUNDS, PASS = 5, ""


@contextlib.contextmanager
def _without(name: str):
    """Builds inside leave the pass `name` out of the pipeline."""
    saved = list(pipeline.PIPELINE)
    pipeline.PIPELINE[:] = [s for s in saved if s.name != name]
    if len(pipeline.PIPELINE) == len(saved):
        raise SystemExit(f"no pass named {name!r} in the pipeline")
    try:
        yield
    finally:
        pipeline.PIPELINE[:] = saved


def ab_row(name: str, batch: int, cache: Path) -> dict:
    _, _, path, _, feeds = suite_row(name, batch, cache)
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / f"pass-ab-{name}-{batch}.db"))
    with _without(PASS):
        engines = {"without": kiln.build(path, config)}
    engines["with"] = kiln.build(path, config)
    ctxs = {k: e.create_context() for k, e in engines.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = {k: ctx.run(feeds) for k, ctx in ctxs.items()}
        outs = {k: ctx.run(feeds) for k, ctx in ctxs.items()}  # the second run of a shape replays its graph
        torch.cuda.synchronize()
    diff = max(float((outs["with"][k].float() - outs["without"][k].float()).abs().max()) for k in outs["with"])
    times = alternating_ms({k: functools.partial(ctx.run, feeds) for k, ctx in ctxs.items()}, ROUNDS)
    med = {k: statistics.median(t) for k, t in times.items()}
    return {"model": name, "batch": batch, "pass": PASS, "median_ms": med, "rounds": times, "max_abs_diff": diff,
            "without_over_with": med["without"] / med["with"],
            "layers": {k: len(e.network.layers) for k, e in engines.items()},
            "tactics": {k: e.tactic_summary() for k, e in engines.items()},
            "eager_reasons": {k: {str(sig): why for sig, why in ctx.eager_reasons.items()} for k, ctx in ctxs.items()},
            "warnings": sorted({str(w.message)[:300] for w in caught}),
            "choices": {k: {n: c.to_json() for n, c in e.tactics.items() if c.source != "only"}
                        for k, e in engines.items()},
            "pass_log": engines["with"].build_info["passes"].get(f"{PASS}.layers")}


def main() -> None:
    global ROUNDS, PASS
    ap = rows_parser(__doc__, "bert:1,minilm:1", 300)
    ap.add_argument("--pass", dest="pass_name", required=True)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    args = ap.parse_args()
    ROUNDS, PASS = args.rounds, args.pass_name
    args.out.mkdir(parents=True, exist_ok=True)
    for r in model_rows(args, ab_row, args.out / "pass-ab.json"):
        print(f"{r['model']} b{r['batch']}: without {PASS} {r['median_ms']['without']:.4f} ms, with "
              f"{r['median_ms']['with']:.4f} ms ({r['without_over_with']:.3f}x); layers {r['layers']}; "
              f"max |diff| {r['max_abs_diff']:.3g}; eager {r['eager_reasons']}; warnings {r['warnings']}; "
              f"tactics {r['tactics']}", flush=True)


if __name__ == "__main__":
    main()
