"""Issue 23's last gaps, one run: ResNet-50's first call at a new batch (cuDNN plans a conv per shape) with and without
the cuDNN conv tactics in a dynamic engine, and BERT-base's dynamic engine against static engines at 4x64 and 32x512
with one profile and with shape buckets; torch reduce-overhead at the gap shapes in the same run.

For each dynamic engine: tactic summary, first call (synchronized) at shapes the warm-up did not meet, and the median
call + synchronize (benchmarks.dynamic's loop) at the sweep's shapes; static engines and reduce-overhead the same.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_dynamic_gaps --out $OUT/gaps.json
"""

from __future__ import annotations

import contextlib
import time
import traceback

import torch

import kiln
from benchmarks.dynamic import IMAGE_SIZE, RANGES, input_shapes
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.peers import prepare
from benchmarks.probes.harness import Budget, once_ms, parser, wall_ms, write_json
from benchmarks.suite import CACHE
from kiln.tactics import registry

CUDNN = ("cudnn_conv", "cudnn_fused_conv")
PLAN = {
    "resnet50": {"steady": ((1,), (8,), (32,), (64,)), "first": ((7,), (13,), (40,), (3,)), "static": ((1,), (8,)),
                 "peer": ((1,),),
                 "engines": {"dynamic": {}, "dynamic no cudnn": {"without": CUDNN}}},
    "bert": {"steady": ((4, 64), (32, 512), (8, 128)), "first": ((5, 77), (2, 32), (16, 100), (3, 300)),
             "static": ((4, 64), (32, 512)), "peer": ((4, 64), (32, 512)),
             "engines": {"dynamic": {}, "dynamic buckets 3": {"shape_buckets": 3}}},
}


@contextlib.contextmanager
def without(names: tuple[str, ...]):
    """The tactic registry with `names` left out of every kind's candidates, for the block."""
    registry._load()
    saved = {k: list(v) for k, v in registry.BY_KIND.items()}
    for k, v in registry.BY_KIND.items():
        v[:] = [t for t in v if t.name not in names]
    try:
        yield
    finally:
        for k, v in saved.items():
            registry.BY_KIND[k][:] = v


def feeds(spec, shape) -> dict[str, torch.Tensor]:
    inputs = spec.inputs(shape[0], shape[1] if spec.task == "text" else IMAGE_SIZE)
    return {k: v.cuda() for k, v in inputs.items()}


def label(shape) -> str:
    return "x".join(map(str, shape))


def build(path, profiles, cache: str, **kw):
    t = time.perf_counter()
    engine = kiln.build(path, kiln.BuildConfig(profiles=profiles, fp16=True, timing_cache=cache, **kw))
    return engine, time.perf_counter() - t


def main() -> None:
    ap = parser(__doc__, out="gaps.json")
    ap.add_argument("--models", default="resnet50,bert")
    ap.add_argument("--budget-seconds", type=float, default=500)
    args = ap.parse_args()
    budget, results = Budget(args.budget_seconds), {}
    for name in args.models.split(","):
        plan, spec, out = PLAN[name], SPECS[name], {}
        results[name] = out
        made = instantiate(spec, spec.default_size)
        path, _ = onnx_file(spec, made, spec.default_size, CACHE, dynamic_seq=True)
        ends = [input_shapes(spec, s) for s in RANGES[spec.task]]
        profile = {n: tuple(e[n] for e in ends) for n in spec.input_names}
        for what, opts in plan["engines"].items():
            if budget.left < 60:
                out[what] = {"skipped": "budget"}
                continue
            opts = dict(opts)
            gone = opts.pop("without", ())
            try:
                with without(gone) if gone else contextlib.nullcontext():
                    cache = str(CACHE / f"timing-cache{'-' + '-'.join(gone) if gone else ''}.sqlite")
                    engine, secs = build(path, (profile,), cache, **opts)
                ctx = engine.create_context()
                row = {"build_s": secs, "warm_up_s": engine.build_info.get("warm_up_seconds"),
                       "tactics": engine.tactic_summary(), "first_ms": {}, "median_ms": {}}
                for s in plan["first"]:
                    f = feeds(spec, s)
                    row["first_ms"][label(s)] = once_ms(lambda: ctx.run(f))
                for s in plan["steady"]:
                    f = feeds(spec, s)
                    row["median_ms"][label(s)] = wall_ms(lambda: ctx.run(f), iters=100)
                out[what] = row
                budget.log(f"{name} {what}: {row}")
                ctx = engine = None
            except Exception as e:  # noqa: BLE001 - one failure never ends the run
                traceback.print_exc()
                out[what] = {"error": f"{type(e).__name__}: {e}"[:400]}
        for s in plan["static"]:
            if budget.left < 40:
                break
            f = feeds(spec, s)
            engine, secs = build(path, ({k: (tuple(v.shape),) * 3 for k, v in f.items()},),
                                 str(CACHE / "timing-cache.sqlite"))
            ctx = engine.create_context()
            out.setdefault("static", {})[label(s)] = {"build_s": secs, "median_ms": wall_ms(lambda: ctx.run(f),
                                                                                           iters=100)}
            budget.log(f"{name} static {label(s)}: {out['static'][label(s)]}")
            ctx = engine = None
        module, _ = prepare(made.module, {}, "fp16", "cuda", spec.channels_last)
        for s in plan["peer"]:
            if budget.left < 40:
                break
            f = feeds(spec, s)
            call_args = [v.half() if v.is_floating_point() else v for v in f.values()]
            if spec.channels_last:
                call_args = [a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in call_args]
            torch._dynamo.reset()
            fn = torch.compile(module, mode="reduce-overhead", dynamic=False)

            def call():
                with torch.no_grad():
                    return fn(*call_args)
            first = once_ms(call)
            out.setdefault("reduce_overhead", {})[label(s)] = {"first_ms": first, "median_ms": wall_ms(call, iters=100)}
            budget.log(f"{name} reduce-overhead {label(s)}: {out['reduce_overhead'][label(s)]}")
        write_json(args.out, {"results": results})
        torch.cuda.empty_cache()
    write_json(args.out, {"results": results})


if __name__ == "__main__":
    main()
