"""Issue 4's GPU acceptance in one run: FP16 engines of the five suite models against ONNX Runtime fp32 (three
runs on one context with different inputs: CUDA-graph capture, then replays, all from the activation arena),
ResNet-50's cold vs warm-timing-cache build times at the default opt level, and a dynamic-batch BERT build
(symbolic layers tuned at the profile's opt shapes) checked at three batch sizes.

    python -m benchmarks.probes.gpu_engines_check --out DIR [--models resnet50,...] [--batch 1]

Writes DIR/engines-check.json; prints one table row per model last.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import kiln
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.probes.harness import facts, parser


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    cos = float(g @ w / (np.linalg.norm(g) * np.linalg.norm(w) + 1e-300))
    return {"cosine": cos, "max_rel": float(np.abs(g - w).max() / (np.abs(w).max() + 1e-300)),
            "finite": bool(np.isfinite(g).all())}


def check_model(name: str, batch: int, cache: Path) -> dict:
    spec = SPECS[name]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, cache)
    feeds = {k: v.numpy() for k, v in spec.inputs(batch, spec.default_size, seed=1).items()}
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    config = kiln.BuildConfig.with_shapes({k: v.shape for k, v in feeds.items()}, device="cuda", fp16=True)
    t0 = time.perf_counter()
    engine = kiln.build(path, config)
    build_s = time.perf_counter() - t0
    ctx = engine.create_context()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    outs = {}
    for run in range(3):  # capture, then two replays; inputs differ from run to run
        run_feeds = feeds if run != 1 else {k: v.numpy() for k, v in spec.inputs(batch, spec.default_size,
                                                                                  seed=7).items()}
        run_want = want if run != 1 else dict(zip([o.name for o in sess.get_outputs()], sess.run(None, run_feeds)))
        got = ctx.run(run_feeds)
        for k in run_want:
            c = compare(got[k], run_want[k])
            if k not in outs or c["cosine"] < outs[k]["cosine"]:
                outs[k] = c
    plan = engine.memory_plan
    arena = {"arena_bytes": plan.arena_bytes, "placed": len(plan.offsets), "unplaced": plan.unplaced,
             "peak_run_bytes": torch.cuda.max_memory_allocated() - base, "graphs": len(ctx.graphs.runs)
             if ctx.graphs else 0, "eager": ctx.eager_reasons}
    notes = engine.build_info.get("load_notes", [])  # tactics the engine could not compile or run here
    return {"model": name, "batch": batch, "source": made.source, "build_s": round(build_s, 1), "arena": arena,
            "outputs": outs, "load_notes": notes,
            "ok": not notes and all(o["cosine"] >= 0.999 and o["finite"] for o in outs.values())}


def dynamic_check(cache: Path) -> dict:
    """BERT fp16 with batch 1..16 (opt 8): which tactics the symbolic layers got, outputs vs ORT at 1, 8, 16."""
    spec = SPECS["bert"]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, cache)
    shapes = {k: v.shape for k, v in spec.inputs(1, spec.default_size, seed=1).items()}
    profile = {k: ((1, *s[1:]), (8, *s[1:]), (16, *s[1:])) for k, s in shapes.items()}
    t0 = time.perf_counter()
    engine = kiln.build(path, kiln.BuildConfig(profiles=(profile,), device="cuda", fp16=True))
    build_s = time.perf_counter() - t0
    symbolic = [l.name for l in engine.network.layers
                if not all(engine.network.tensors[o].is_static for o in l.outputs if o)]
    tactics = {}
    for n in symbolic:
        t = engine.tactics[n].tactic
        tactics[t] = tactics.get(t, 0) + 1
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ctx, worst = engine.create_context(), {}
    for b in (1, 8, 16):
        feeds = {k: v.numpy() for k, v in spec.inputs(b, spec.default_size, seed=b).items()}
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        got = ctx.run(feeds)
        worst[b] = min(compare(got[k], want[k])["cosine"] for k in want)
    return {"model": "bert", "build_s": round(build_s, 1), "symbolic_layers": len(symbolic),
            "tactics_of_symbolic_layers": tactics, "worst_cosine_by_batch": worst,
            "ok": all(c >= 0.999 for c in worst.values())}


def cache_speedup(cache: Path, batch: int) -> dict:
    """ResNet-50 fp16 at the default opt level: a cold build filling a fresh timing cache, then a warm one."""
    spec = SPECS["resnet50"]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, cache)
    db = cache / f"timing-{time.time_ns()}.db"
    shapes = {"input": (batch, 3, spec.default_size, spec.default_size)}
    times = []
    for _ in range(2):
        config = kiln.BuildConfig.with_shapes(shapes, device="cuda", fp16=True, timing_cache=str(db))
        t0 = time.perf_counter()
        engine = kiln.build(path, config)
        times.append(time.perf_counter() - t0)
    return {"model": "resnet50", "batch": batch, "opt_level": config.opt_level, "cold_s": round(times[0], 2),
            "warm_s": round(times[1], 2), "speedup": round(times[0] / times[1], 2),
            "timing_cache": engine.build_info.get("timing_cache")}


def main() -> None:
    ap = parser(__doc__, required=True, out_help="folder for engines-check.json")
    ap.add_argument("--cache", type=Path, default=Path(".kiln-cache/benchmarks"))
    ap.add_argument("--models", default="resnet50,mobilenet_v2,vit_b_16,bert,minilm")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache-batch", type=int, default=64)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    result = facts() | {"onnxruntime": ort.__version__, "models": [], "cache": None}
    try:
        result["cache"] = cache_speedup(args.cache, args.cache_batch)
    except Exception as e:  # noqa: BLE001 - a check reports, it does not stop
        result["cache"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    print(json.dumps(result["cache"]), flush=True)
    try:
        result["dynamic"] = dynamic_check(args.cache)
    except Exception as e:  # noqa: BLE001
        result["dynamic"] = {"error": f"{type(e).__name__}: {e}"[:800]}
    print(json.dumps(result["dynamic"]), flush=True)
    for name in args.models.split(","):
        try:
            row = check_model(name, args.batch, args.cache)
        except Exception as e:  # noqa: BLE001
            row = {"model": name, "error": f"{type(e).__name__}: {e}"[:800], "ok": False}
        result["models"].append(row)
        print(json.dumps(row), flush=True)
        (args.out / "engines-check.json").write_text(json.dumps(result, indent=1))
    print(f"\n{result['device']} {result['date']} torch {result['torch']}")
    c = result["cache"]
    if "cold_s" in c:
        print(f"resnet50 b{c['batch']} build: cold {c['cold_s']} s, warm {c['warm_s']} s, {c['speedup']}x")
    print(f"{'model':14} {'ok':4} {'build s':>8}  worst cosine / max rel err   arena (placed/own)  peak run MiB")
    for r in result["models"]:
        if "error" in r:
            print(f"{r['model']:14} ERR  {r['error'][:100]}")
            continue
        worst = min(r["outputs"].values(), key=lambda o: o["cosine"])
        a = r["arena"]
        print(f"{r['model']:14} {'yes' if r['ok'] else 'NO':4} {r['build_s']:8.1f}  "
              f"{worst['cosine']:.6f} / {max(o['max_rel'] for o in r['outputs'].values()):.2e}   "
              f"{(a['arena_bytes'] or 0) / 2**20:7.1f} MiB ({a['placed']}/{a['unplaced']})  "
              f"{a['peak_run_bytes'] / 2**20:8.1f}")


if __name__ == "__main__":
    main()
