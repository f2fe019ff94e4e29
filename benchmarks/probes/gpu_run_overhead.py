"""Where a small engine call's time goes (issues 23, 27: batch-1 latency): for each model at a small shape, the wall
time (call, synchronize) of `ctx.run`, of its captured graph's replay alone, of the replay with its input copies and
output clones, the graph's device time, a bare synchronize, and torch.compile reduce-overhead; plus a cProfile of the
host side of `ctx.run`.

    python -m benchmarks.probes.gpu_run_overhead --out $OUT/run-overhead.json [--models resnet50:1,minilm:1x16]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

import kiln
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.peers import cast_inputs, prepare
from benchmarks.probes.harness import event_ms, parser, sync, wall_ms, write_json
from benchmarks.suite import CACHE
from kiln.runtime.cuda_graph import signature


def host_us(fn, n: int = 300) -> float:
    """Mean host µs of fn() without synchronizing (the launch side only)."""
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    sync()
    return host


def profile_text(fn, n: int = 300, top: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    sync()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def measure_model(name: str, shape: tuple[int, ...], dynamic: bool, peers: bool) -> dict:
    spec = SPECS[name]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, CACHE, dynamic_seq=True)
    inputs = spec.inputs(shape[0], shape[1] if spec.task == "text" else 224)
    feeds = {k: v.cuda() for k, v in inputs.items()}
    static = {k: (tuple(v.shape),) * 3 for k, v in feeds.items()}
    row = {}
    kinds = {"static": static}
    if dynamic:
        lo = {k: (1,) + tuple(v.shape[1:]) if spec.task == "image" else (1, 16) for k, v in feeds.items()}
        hi = {k: (64,) + tuple(v.shape[1:]) if spec.task == "image" else (32, 512) for k, v in feeds.items()}
        kinds["dynamic"] = {k: (lo[k], tuple(v.shape), hi[k]) for k, v in feeds.items()}
    for kind, profile in kinds.items():
        engine = kiln.build(path, kiln.BuildConfig(profiles=(profile,), fp16=True,
                                                   timing_cache=str(CACHE / "timing-cache.sqlite")))
        ctx = engine.create_context()
        ctx.run(feeds)
        sync()
        captured = ctx.graphs.runs[signature(ctx.upload(ctx.check(feeds)[0]))]
        r = {"run_wall_ms": wall_ms(lambda: ctx.run(feeds), iters=300, warmup=30),
             "replay_only_wall_ms": wall_ms(captured.graph.replay, iters=300, warmup=30),
             "replay_with_io_wall_ms": wall_ms(lambda: captured.replay(feeds, {}), iters=300, warmup=30),
             "graph_device_ms": event_ms(captured.graph.replay, iters=200, warmup=20),
             "run_event_ms": event_ms(lambda: ctx.run(feeds), iters=200, warmup=20),
             "sync_only_wall_ms": wall_ms(lambda: None, iters=300, warmup=30),
             "run_host_us": host_us(lambda: ctx.run(feeds)),
             "replay_with_io_host_us": host_us(lambda: captured.replay(feeds, {})),
             "check_host_us": host_us(lambda: ctx.check(feeds)),
             "profile": profile_text(lambda: ctx.run(feeds))}
        row[kind] = r
        print(name, shape, kind, {k: round(v, 4) for k, v in r.items() if k != "profile"}, flush=True)
    if peers:
        module, _ = prepare(made.module, {}, "fp16", "cuda", spec.channels_last)
        args = cast_inputs(inputs, "fp16", "cuda", spec.channels_last)
        torch._dynamo.reset()
        ro = torch.compile(module, mode="reduce-overhead", dynamic=False)

        def call():
            with torch.no_grad():
                return ro(*args)
        for _ in range(5):
            call()
        row["reduce_overhead_wall_ms"] = wall_ms(call, iters=300, warmup=30)
        row["reduce_overhead_host_us"] = host_us(call)
        print(name, shape, "reduce-overhead", row["reduce_overhead_wall_ms"], row["reduce_overhead_host_us"],
              flush=True)
    return row


def main() -> None:
    ap = parser(__doc__, out="run-overhead.json")
    ap.add_argument("--models", default="resnet50:1,minilm:1x16")
    ap.add_argument("--dynamic", action="store_true", help="also a dynamic engine over the benchmark's range")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    results = {}
    for item in args.models.split(","):
        name, shape = item.split(":")
        results[item] = measure_model(name, tuple(int(x) for x in shape.split("x")), args.dynamic,
                                      not args.no_peers)
    write_json(args.out, {"what": "wall = call + synchronize, median; host = launch side only, mean",
                          "results": results})


if __name__ == "__main__":
    main()
