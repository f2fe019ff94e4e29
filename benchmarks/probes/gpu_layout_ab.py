"""The layout passes (sink_transpose, gemm_rows, collapse_views) on and off, in one run: each row's fp16 engine
built both ways, timed with the same inputs, next to torch eager and reduce-overhead; kernel time by category
(gpu_kernel_split) for each.

    python -m benchmarks.probes.gpu_layout_ab --out DIR [--rows vit_b_16:64,vit_b_16:1,bert:64,minilm:64]

Writes DIR/layout-ab.json.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import kiln
from benchmarks.probes.gpu_kernel_split import split, torch_peers
from benchmarks.probes.harness import event_ms, model_rows, rows_parser, suite_row
from kiln.passes.registry import LAYOUT_STEPS
from kiln.quant import pipeline


def _build(path: Path, feeds: dict, cache: Path, layout: bool):
    """The engine with or without the layout passes (the pipeline's list edited for this build only)."""
    full = list(pipeline.PIPELINE)
    if not layout:
        pipeline.PIPELINE[:] = [s for s in full if s not in LAYOUT_STEPS]
    try:
        config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda",
                                              fp16=True, timing_cache=str(cache / "layout-timing.db"))
        start = time.perf_counter()
        engine = kiln.build(path, config)
        return engine, time.perf_counter() - start
    finally:
        pipeline.PIPELINE[:] = full


def row(name: str, batch: int, cache: Path) -> dict:
    spec, made, path, inputs, feeds = suite_row(name, batch, cache)
    out: dict = {"model": name, "batch": batch}
    outputs = {}
    for layout in (False, True):
        engine, seconds = _build(path, feeds, cache, layout)
        ctx = engine.create_context()
        key = "with_layout" if layout else "without_layout"
        outputs[key] = [v.float().cpu() for v in ctx.run(feeds).values()]
        kinds = [l.kind for l in engine.network.layers]
        out[key] = {"build_s": seconds, "layers": len(kinds), "strided_views": kinds.count("StridedView"),
                    "ms": event_ms(lambda: ctx.run(feeds), iters=100, warmup=20)} | split(lambda: ctx.run(feeds))
    out["max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(*outputs.values()))
    for peer, call in torch_peers(spec, made, inputs).items():
        out[peer] = {"ms": event_ms(call, iters=100, warmup=20)}
    best = min(out["eager"]["ms"], out["reduce-overhead"]["ms"])
    for key in ("without_layout", "with_layout"):
        out[key]["best_torch_over_kiln"] = best / out[key]["ms"]
    torch.cuda.empty_cache()
    return out


def main() -> None:
    args = rows_parser(__doc__, "vit_b_16:64,vit_b_16:1,bert:64,minilm:64", 420).parse_args()
    rows = model_rows(args, row, args.out / "layout-ab.json")
    for r in rows:
        a, b = r["without_layout"], r["with_layout"]
        print(f"{r['model']} b{r['batch']}: without {a['ms']:.3f} ms ({a['best_torch_over_kiln']:.2f}x), with "
              f"{b['ms']:.3f} ms ({b['best_torch_over_kiln']:.2f}x), {b['strided_views']} views, eager "
              f"{r['eager']['ms']:.3f}, reduce-overhead {r['reduce-overhead']['ms']:.3f}, max diff "
              f"{r['max_abs_diff']:.2e}")
        for k in ("without_layout", "with_layout"):
            cats = ", ".join(f"{c} {v:.3f}" for c, v in sorted(r[k]["by_category"].items(), key=lambda kv: -kv[1]))
            print(f"    {k}: kernels {r[k]['kernel_ms']:.3f} ms: {cats}")


if __name__ == "__main__":
    main()
