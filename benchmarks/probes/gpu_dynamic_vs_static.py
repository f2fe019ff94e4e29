"""Where a dynamic engine loses to a static one at the same shape (issue 23: BERT 4x64 measured 1.01-1.20x its static
engine across runs): both timed interleaved (call + synchronize, best of rounds), each traced (kernel µs per call by
kernel name, the largest differences, idle time), and the layers whose tactic or config differ.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_dynamic_vs_static --out $OUT/dvs.json --shapes 4x64,8x128
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import kiln
from benchmarks.dynamic import input_shapes, profile
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.probes import harness
from benchmarks.probes.gpu_gap_trace import chrome_trace, device_spans, gaps
from benchmarks.suite import CACHE

CALLS = 5


def kernel_us(call) -> tuple[dict[str, float], dict]:
    """µs per call by device activity name over CALLS traced calls, and the idle-gap summary."""
    spans = device_spans(chrome_trace(harness.profiled(call, CALLS, warmup=5)))
    by_name: dict[str, float] = defaultdict(float)
    for s, e, name in spans:
        by_name[name[:120]] += (e - s) / CALLS
    return dict(by_name), gaps(spans, CALLS)


def main() -> None:
    p = harness.parser(__doc__, out="/tmp/gpu_dynamic_vs_static.json")
    p.add_argument("--model", default="bert")
    p.add_argument("--shapes", default="4x64,8x128")
    args = p.parse_args()
    clock = harness.Budget(500)
    harness.banner()
    spec = SPECS[args.model]
    path, _ = onnx_file(spec, instantiate(spec, spec.default_size), spec.default_size, Path(CACHE), dynamic_seq=True)
    cache = str(Path(CACHE) / "timing-cache.sqlite")
    dynamic = kiln.build(str(path), kiln.BuildConfig(fp16=True, timing_cache=cache, profiles=(profile(spec),)))
    clock.log("built the dynamic engine")
    out = {"model": args.model, "rows": []}
    for text in args.shapes.split(","):
        shape = tuple(int(d) for d in text.split("x"))
        inputs = spec.inputs(shape[0], shape[1] if spec.task == "text" else 224)
        feeds = {k: v.cuda() for k, v in inputs.items()}
        static = kiln.build(str(path), kiln.BuildConfig.with_shapes(input_shapes(spec, shape), fp16=True,
                                                                    timing_cache=cache))
        cd, cs = dynamic.create_context(), static.create_context()
        run_d, run_s = (lambda: cd.run(feeds)), (lambda: cs.run(feeds))
        rounds = [(harness.wall_ms(run_d), harness.wall_ms(run_s)) for _ in range(5)]
        kd, gd = kernel_us(run_d)
        ks, gs = kernel_us(run_s)
        diff = sorted(((kd.get(n, 0.0) - ks.get(n, 0.0), n) for n in set(kd) | set(ks)), key=lambda x: -abs(x[0]))
        tactics = {l.name: [dynamic.tactics[l.name].to_json(), static.tactics[l.name].to_json()]
                   for l in static.network.layers if l.name in dynamic.tactics
                   and dynamic.tactics[l.name] != static.tactics[l.name]}
        row = {"shape": text, "rounds_ms": rounds, "dynamic_ms": min(r[0] for r in rounds),
               "static_ms": min(r[1] for r in rounds), "event_dynamic_ms": harness.event_ms(run_d),
               "event_static_ms": harness.event_ms(run_s),
               "kernel_us": {"dynamic": sum(kd.values()), "static": sum(ks.values())},
               "kernels": {"dynamic": len(kd), "static": len(ks)}, "gaps": {"dynamic": gd, "static": gs},
               "largest_differences_us": [[round(d, 2), n] for d, n in diff[:25]],
               "tactics_differing": tactics, "dynamic_layers": len(dynamic.network.layers),
               "static_layers": len(static.network.layers)}
        row["ratio"] = row["dynamic_ms"] / row["static_ms"]
        out["rows"].append(row)
        harness.write_json(args.out, out)
        clock.log(f"{text}: dynamic {row['dynamic_ms']:.3f} static {row['static_ms']:.3f} ms ({row['ratio']:.3f}x); "
                  f"kernels {row['kernel_us']['dynamic']:.0f} vs {row['kernel_us']['static']:.0f} us; idle "
                  f"{gd['idle_ms']:.3f} vs {gs['idle_ms']:.3f} ms; {len(tactics)} layers' tactics differ")
        for d, n in diff[:12]:
            print(f"    {d:+8.2f} us  {n}")


if __name__ == "__main__":
    main()
