"""Idle gaps on the GPU inside a kiln engine's call: the CUDA-graph replay traced (torch.profiler, Chrome trace),
device activities sorted by start, and the time between one's end and the next one's start summed and listed,
with the activities either side; each kernel name's busy time a call; plus each layer's tactic. For rows whose
event time exceeds their kernel time.

    python -m benchmarks.probes.gpu_gap_trace --out DIR [--rows bert@512:32,bert:64]

Writes DIR/gap-trace.json; prints per row the kernel and gap ms per call and the largest gaps.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import kiln
from benchmarks.probes.harness import event_ms, model_rows, profiled, rows_parser, suite_row

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CALLS = 3


def device_spans(trace: dict) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of each device activity of a Chrome trace, by start."""
    out = [(e["ts"], e["ts"] + e.get("dur", 0), e.get("name", "?")) for e in trace.get("traceEvents", [])
           if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"]
    return sorted(out)


def chrome_trace(prof) -> dict:
    """A finished profiler's Chrome trace, as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/t.json")
        return json.loads(Path(f"{tmp}/t.json").read_text())


def gaps(spans: list, calls: int) -> dict:
    """Busy and idle µs between the first activity's start and the last one's end, per call; the largest gaps."""
    idle, listed = 0.0, []
    end = spans[0][1]
    for (s, e, name), prev in zip(spans[1:], spans):
        if s > end:
            idle += s - end
            listed.append((s - end, prev[2][:90], name[:90]))
        end = max(end, e)
    total = spans[-1][1] - spans[0][0]
    listed.sort(reverse=True)
    busy = Counter()
    for s, e, name in spans:
        busy[name[:90]] += (e - s) / calls
    return {"span_ms": total / 1e3 / calls, "idle_ms": idle / 1e3 / calls, "activities": len(spans) // calls,
            "largest": [{"us": round(g, 1), "after": a, "before": b} for g, a, b in listed[:15]],
            "busy_us_by_kernel": {k: round(v, 1) for k, v in busy.most_common(25)}}


def row(name: str, batch: int, cache: Path) -> dict:
    _, _, path, _, feeds = suite_row(name, batch, cache)
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / "gap-timing.db"))
    engine = kiln.build(path, config)
    ctx = engine.create_context()
    call = lambda: ctx.run(feeds)  # noqa: E731
    trace = chrome_trace(profiled(call, CALLS, warmup=5, cpu=True))
    tactics = Counter(f"{engine.network.layers[i].kind}:{c.tactic}{c.config or ''}"
                      for i, c in enumerate(engine.tactics[l.name] for l in engine.network.layers))
    ten = lambda: [call() for _ in range(10)]  # noqa: E731 - back to back: the host's part hidden behind the GPU's
    return {"model": name, "batch": batch, "event_ms": event_ms(call, iters=50, warmup=5),
            "pipelined_ms": event_ms(ten, iters=10, warmup=1) / 10,
            "gaps": gaps(device_spans(trace), CALLS), "tactics": dict(tactics.most_common())}


def main() -> None:
    args = rows_parser(__doc__, "bert@512:32,bert:64", 300).parse_args()
    for r in model_rows(args, row, args.out / "gap-trace.json"):
        g = r["gaps"]
        print(f"\n{r['model']} b{r['batch']}: event {r['event_ms']:.3f} ms, {r['pipelined_ms']:.3f} back to back; "
              "traced span "
              f"{g['span_ms']:.3f} ms per call, "
              f"idle {g['idle_ms']:.3f} ms, {g['activities']} activities")
        for x in g["largest"][:10]:
            print(f"    {x['us']:8.1f} us  after {x['after']}  before {x['before']}")
        for k, us in list(g["busy_us_by_kernel"].items())[:12]:
            print(f"    {us:8.1f} us busy  {k}")
        for t, n in list(r["tactics"].items())[:14]:
            print(f"    {n:4d} {t[:150]}")


if __name__ == "__main__":
    main()
