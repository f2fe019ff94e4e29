"""First calls at new shapes (issue 23: ≤ 50 ms), and where BERT-base 32x512 spends its time, in one run:

  threads   is torch's cuDNN plan cache per thread? A conv planned at a batch on a worker thread, then its first call
            at that batch on the main thread, against a batch planned nowhere.
  resnet50  the dynamic engine (profile 1 / 32 / 64) whose warm-up now runs every batch where cuDNN plans per shape:
            warm-up seconds and shapes, first calls at unseen batches on the main thread and on a new thread, the
            median at 1, 8, 32, 64; then the plan saved and loaded (load seconds) and a first call after the load.
  bert      the dynamic engine (1x16 / 8x128 / 32x512): first calls at shapes the warm-up did not meet, logging every
            Triton kernel compiled during each (name, specialization); the static 32x512 engine's per-layer profile
            grouped by kind and tactic, and torch reduce-overhead's top CUDA kernels at 32x512.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_first_call_plans --out $OUT/plans.json
"""

from __future__ import annotations

import threading
import time
import traceback

import torch

import kiln
from benchmarks.dynamic import IMAGE_SIZE, RANGES, input_shapes
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.peers import prepare
from benchmarks.probes.harness import Budget, once_ms, parser, sync, wall_ms, write_json
from benchmarks.suite import CACHE
from kiln.bench.profile import profile_layers

COMPILED: list[str] = []


def log_triton_compiles() -> None:
    """Record each Triton compile (kernel name and its specialization) in COMPILED."""
    import triton.compiler.compiler as cc
    import triton.runtime.jit as jit

    original = cc.compile

    def compile(src, *args, **kwargs):
        name = getattr(getattr(src, "fn", None), "__name__", type(src).__name__)
        COMPILED.append(f"{name} attrs={getattr(src, 'attrs', None)} constexprs={getattr(src, 'constexprs', None)}"
                        [:600])
        return original(src, *args, **kwargs)

    cc.compile = compile
    for mod in (jit, __import__("triton.compiler", fromlist=["compile"]), __import__("triton")):
        if getattr(mod, "compile", None) is original:
            mod.compile = compile


def on_thread(fn):
    box = []
    worker = threading.Thread(target=lambda: box.append(fn()))
    worker.start()
    worker.join()
    return box[0]


def feeds(spec, shape) -> dict[str, torch.Tensor]:
    inputs = spec.inputs(shape[0], shape[1] if spec.task == "text" else IMAGE_SIZE)
    return {k: v.cuda() for k, v in inputs.items()}


def first_calls(ctx, spec, shapes) -> dict[str, float]:
    """ms of ctx's first call at each shape (inputs made and on the device before the clock starts)."""
    out = {}
    for shape in shapes:
        f = feeds(spec, shape)
        out["x".join(map(str, shape))] = once_ms(lambda: ctx.run(f))
    return out


def profile_of(spec) -> dict:
    ends = [input_shapes(spec, s) for s in RANGES[spec.task]]
    return {n: tuple(e[n] for e in ends) for n in spec.input_names}


def threads() -> dict:
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda().half().to(memory_format=torch.channels_last)

    def run(b):
        x = torch.randn(b, 256, 28, 28, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        return lambda: conv(x)
    with torch.no_grad():
        worker_first = on_thread(lambda: once_ms(run(7)))
        main_after_worker = once_ms(run(7))
        main_fresh = once_ms(run(11))
        main_second = once_ms(run(11))
    return {"worker_first_b7_ms": worker_first, "main_first_b7_after_worker_ms": main_after_worker,
            "main_first_b11_ms": main_fresh, "main_second_b11_ms": main_second}


def resnet(out: dict, budget: Budget) -> None:
    spec = SPECS["resnet50"]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, CACHE, dynamic_seq=True)
    t = time.perf_counter()
    engine = kiln.build(path, kiln.BuildConfig(profiles=(profile_of(spec),), fp16=True,
                                               timing_cache=str(CACHE / "timing-cache.sqlite")))
    out["build_s"] = time.perf_counter() - t
    out["warm_up_s"] = engine.build_info.get("warm_up_seconds")
    out["warm_up_shapes"] = engine.build_info.get("warm_up_shapes")
    out["tactics"] = engine.tactic_summary()
    budget.log(f"resnet50 built: {out}")
    ctx = engine.create_context()
    out["first_ms"] = first_calls(ctx, spec, [(b,) for b in (7, 13, 40, 3)])
    out["first_ms_thread"] = on_thread(lambda: first_calls(engine.create_context(), spec, [(b,) for b in (9, 21, 50)]))
    out["median_ms"] = {}
    for b in (1, 8, 32, 64):
        f = feeds(spec, (b,))
        out["median_ms"][b] = wall_ms(lambda: ctx.run(f), iters=100)
    budget.log(f"resnet50: {out}")
    plan = CACHE / "resnet50-dynamic.plan"
    engine.save(plan, force=True)
    ctx = engine = None
    torch.cuda.empty_cache()
    t = time.perf_counter()
    loaded = kiln.load(plan)
    out["load_s"] = time.perf_counter() - t
    out["load_warm_up_s"] = loaded.build_info.get("warm_up_seconds")
    ctx = loaded.create_context()
    out["first_ms_after_load"] = first_calls(ctx, spec, [(6,), (45,)])
    budget.log(f"resnet50 load: {out}")


def bert(out: dict, budget: Budget) -> None:
    spec = SPECS["bert"]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, CACHE, dynamic_seq=True)
    engine = kiln.build(path, kiln.BuildConfig(profiles=(profile_of(spec),), fp16=True,
                                               timing_cache=str(CACHE / "timing-cache.sqlite")))
    out["warm_up_s"] = engine.build_info.get("warm_up_seconds")
    out["warm_up_shapes"] = engine.build_info.get("warm_up_shapes")
    ctx = engine.create_context()
    out["first"] = {}
    for shape in ((16, 100), (5, 77), (3, 300), (2, 32), (24, 200), (7, 333), (32, 100), (16, 64)):
        COMPILED.clear()
        f = feeds(spec, shape)
        ms = once_ms(lambda: ctx.run(f))
        second = once_ms(lambda: ctx.run(f))
        out["first"]["x".join(map(str, shape))] = {"ms": ms, "second_ms": second, "compiled": list(COMPILED)}
        budget.log(f"bert first {shape}: {ms:.1f} ms, second {second:.1f} ms, compiled {COMPILED}")
    ctx = engine = None
    f = feeds(spec, (32, 512))
    static = kiln.build(path, kiln.BuildConfig(profiles=({k: (tuple(v.shape),) * 3 for k, v in f.items()},),
                                               fp16=True, timing_cache=str(CACHE / "timing-cache.sqlite")))
    ctx = static.create_context()
    out["static_32x512_ms"] = wall_ms(lambda: ctx.run(f), iters=50)
    prof = profile_layers(static, f, iterations=10)
    out["static_32x512_profile_ms"] = prof.total_ms
    out["static_32x512_by_kind"] = prof.by_kind()
    out["static_32x512_top"] = prof.to_json()["layers"][:15]
    budget.log(f"bert static 32x512 {out['static_32x512_ms']:.3f} ms; by kind {out['static_32x512_by_kind']}")
    module, _ = prepare(made.module, {}, "fp16", "cuda", False)
    fn = torch.compile(module, mode="reduce-overhead", dynamic=False)
    args = list(f.values())

    def call():
        with torch.no_grad():
            return fn(*args)
    for _ in range(3):
        call()
    out["reduce_overhead_32x512_ms"] = wall_ms(call, iters=50)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            call()
        sync()
    rows = sorted(((e.key, e.device_time_total / 5 / 1e3, e.count // 5) for e in p.key_averages()),
                  key=lambda r: -r[1])
    out["reduce_overhead_32x512_kernels"] = [{"kernel": k[:160], "ms": ms, "calls": n} for k, ms, n in rows[:25]]
    budget.log(f"bert reduce-overhead 32x512 {out['reduce_overhead_32x512_ms']:.3f} ms; "
               f"top {out['reduce_overhead_32x512_kernels'][:8]}")


def main() -> None:
    ap = parser(__doc__, out="plans.json")
    ap.add_argument("--parts", default="threads,resnet50,bert")
    ap.add_argument("--budget-seconds", type=float, default=500)
    args = ap.parse_args()
    budget, results = Budget(args.budget_seconds), {}
    log_triton_compiles()
    parts = {"threads": lambda o, b: o.update(threads()), "resnet50": resnet, "bert": bert}
    for name in args.parts.split(","):
        results[name] = {}
        try:
            parts[name](results[name], budget)
        except Exception as e:  # noqa: BLE001 - one failure never ends the run
            traceback.print_exc()
            results[name]["error"] = f"{type(e).__name__}: {e}"[:400]
        write_json(args.out, {"results": results})
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
