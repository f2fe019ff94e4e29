"""Where the time goes in the suite's fp16 engines: each layer timed on its own (CUDA events, eager), summed by
kind and tactic, next to the engine's CUDA-graph latency, for the benchmark rows still behind their target.

    python -m benchmarks.probes.gpu_profile_rows --out DIR [--rows mobilenet_v2:64,vit_b_16:64,bert:1]

Writes DIR/profile-rows.json; prints the top kinds of each row last.
"""

from __future__ import annotations

from pathlib import Path


import kiln
from benchmarks.probes.harness import event_ms, model_rows, rows_parser, suite_row
from kiln.bench.profile import profile_layers


def graph_ms(ctx, feeds, n: int = 50) -> float:
    return event_ms(lambda: ctx.run(feeds), iters=n, warmup=5)


def profile_row(name: str, batch: int, cache: Path) -> dict:
    _, _, path, _, feeds = suite_row(name, batch, cache)
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / "profile-timing.db"))
    engine = kiln.build(path, config)
    prof = profile_layers(engine, feeds, iterations=10)
    return {"model": name, "batch": batch, "graph_ms": graph_ms(engine.create_context(), feeds),
            "eager_sum_ms": prof.total_ms, "layers": len(prof.layers), "by_kind": prof.by_kind(),
            "slowest": [{"layer": t.name, "kind": t.kind, "tactic": t.tactic, "ms": t.mean}
                        for t in prof.ranked()[:5]],
            "every_layer": [{"layer": t.name, "kind": t.kind, "tactic": t.tactic, "ms": t.mean,
                             "config": engine.tactics[t.name].config, "tuned_us": engine.tactics[t.name].microseconds}
                            for t in prof.layers]}


def main() -> None:
    args = rows_parser(__doc__, "mobilenet_v2:64,vit_b_16:64,bert:1,resnet50:1", 200).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = model_rows(args, profile_row, args.out / "profile-rows.json")
    for r in rows:
        print(f"\n{r['model']} b{r['batch']}: graph {r['graph_ms']:.3f} ms, "
              f"eager layer sum {r['eager_sum_ms']:.3f} ms, "
              f"{r['layers']} layers")
        for g in r["by_kind"][:7]:
            print(f"  {g['percent']:5.1f}%  {g['ms']:7.3f} ms  {g['layers']:4d} × {g['kind']} [{g['tactic']}]")


if __name__ == "__main__":
    main()
