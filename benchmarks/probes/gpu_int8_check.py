"""On CUDA: kiln int8, fp8 (and fp16) engines vs fp32 torch for accuracy, vs the fp32 engine for size, and vs torch
fp16 eager and torch.compile(mode="reduce-overhead") for speed, all in one run.

    python -m benchmarks.probes.gpu_int8_check --out DIR [--budget-seconds 240] [--models resnet50,minilm,bert]
                                                 [--batches 64,1] [--opt-level 2] [--calibrator entropy]
                                                 [--precisions int8,fp8,fp16]

Models (benchmarks/models.py, random weights): ResNet-50 (BatchNorm statistics calibrated on random images, so
activations are trained-like), MiniLM-L6 and BERT-base encoders at sequence 128. Each is exported to ONNX once
(dynamic batch, cached under .kiln-cache/benchmarks) and built per batch: kiln fp16, kiln int8 (calibrated on 32
random samples other than the ones measured; layers left float run fp16), kiln fp8 (--fp8, e4m3, the same
calibration; a GPU of compute capability 8.9 or later) when --precisions names fp8. Accuracy: cosine and max-rel
of every output vs torch fp32 (TF32 off) on the same inputs. Size: plan bytes, int8 (fp8) ÷ fp32 plan (a CPU fp32
build), target ≤ 0.3. Time: CUDA events around each call, median of --iterations after warm-up. Each step is
guarded (a failure is recorded and the run goes on) and skipped when the budget would be overrun. JSON goes to
DIR/gpu_int8_check.json after every row; the table is printed last.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

import kiln
from benchmarks.probes.harness import ROOT, facts, parser
from benchmarks.models import SPECS, instantiate, onnx_file, realistic
from benchmarks.peers import prepare, runner
from kiln.bench.profile import profile_layers
from kiln.util.timing import measure

CALIB_SAMPLES = 32
FAILED = ("failed", "wrong result", "output ")  # a candidate that ran and was rejected (not one that was refused)
QUANTIZED = ("int8", "fp8")  # --precisions values built with calibration (--int8 / --fp8)
SIZE_TARGET = 0.3


class Budget:
    """Seconds left for the run; a step is skipped when less is left than the same step took before."""

    def __init__(self, seconds: float):
        self.start, self.seconds, self.cost = time.perf_counter(), seconds, {}

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, step: str) -> bool:
        return self.elapsed + self.cost.get(step, 0.0) < self.seconds

    def run(self, step: str, fn) -> dict:
        """fn()'s result dict, {"error": ...} when it fails, {"skipped": ...} when the budget is spent."""
        if not self.allows(step):
            return {"skipped": f"budget spent ({self.elapsed:.0f} of {self.seconds:.0f} s)"}
        print(f"[{self.elapsed:6.1f} s] {step}", flush=True)
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as e:  # one failure never ends the run
            print(traceback.format_exc()[-3000:], file=sys.stderr, flush=True)
            return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]}
        finally:
            self.cost[step.split(" ")[0]] = max(self.cost.get(step.split(" ")[0], 0.0), time.perf_counter() - t0)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def median_ms(fn, device: str, warmup: int, iterations: int) -> dict:
    """CUDA events around each call (wall clock on the CPU), through kiln's bench timer: the median and the minimum."""
    stats = measure(fn, device=device, warmup=warmup, iterations=iterations)
    return {"median_ms": stats.median, "min_ms": stats.min, "iterations": stats.count}


def accuracy(names: list[str], got: list, want: list) -> dict:
    out = {}
    for name, g, w in zip(names, got, want):
        g, w = torch.as_tensor(g).double().flatten().cpu(), w.double().flatten().cpu()
        err = (g - w).abs().max().item()
        out[name] = {"cosine": torch.nn.functional.cosine_similarity(g, w, dim=0).item(),
                     "max_rel": err / max(w.abs().max().item(), 1e-30)}
    return out


def make_model(name: str, size: int):
    spec = SPECS[name]
    made = instantiate(spec, size)
    if spec.task == "image":
        torch.manual_seed(0)
        realistic(made.module, size)
    return spec, made


def fp32_reference(made, inputs: dict, device: str) -> list[torch.Tensor]:
    model, args = prepare(made.module, inputs, "fp32", device, channels_last=False)
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            out = model(*args)
        return [t.float() for t in (out if isinstance(out, (tuple, list)) else [out])]
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def build_kiln(spec, path: Path, inputs: dict, want: list, precision: str, args) -> dict:
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    extra = {}
    calib = None
    if precision in QUANTIZED:
        batch = next(iter(shapes.values()))[0]
        calib = [{k: v.numpy() for k, v in spec.inputs(min(batch, 8), args.size_of(spec), seed=100 + i).items()}
                 for i in range(max(1, CALIB_SAMPLES // min(batch, 8)))]
        extra = {precision: True, "calibrator": args.calibrator, "smooth_alpha": args.smooth_alpha}
    config = kiln.BuildConfig.with_shapes(shapes, device=args.device, fp16=precision == "fp16",
                                          opt_level=args.opt_level, timing_cache=str(args.out / "timing-cache.sqlite")
                                          if args.device == "cuda" else None, **extra)
    t0 = time.perf_counter()
    engine = kiln.build(path, config, calib_data=calib)
    result = {"build_seconds": time.perf_counter() - t0, "plan_bytes": len(engine.serialize()),
              "tactics": engine.build_info.get("tactics"),
              "build_phases": engine.build_info.get("build_phases"),
              "build_counts": engine.build_info.get("build_counts"),
              "build_check_seconds": dict(list((engine.build_info.get("build_check_seconds") or {}).items())[:12]),
              "candidates": {n: c.timed for n, c in engine.tactics.items() if len(c.timed) > 1},
              "failed": {n: [r for r in c.rejected if r[1].startswith(FAILED)] for n, c in engine.tactics.items()
                         if any(r[1].startswith(FAILED) for r in c.rejected)}}
    if precision in QUANTIZED:
        from kiln.quant.report import int8_summary, size_breakdown

        s = int8_summary(engine.build_info)
        result |= {"quantized_layers": s["quantized_layers"], "quantizable_layers": s["quantizable_layers"],
                   "size_by_content": size_breakdown(engine.network)}
    ctx = engine.create_context()
    feeds = {k: v.to(args.device) for k, v in inputs.items()}
    outs = ctx.run(feeds)
    if args.profile and precision in QUANTIZED:  # where the time goes: each layer's device time on its own
        prof = profile_layers(engine, feeds, iterations=10)
        result["profile"] = {"layer_sum_ms": prof.total_ms, "by_kind": prof.by_kind()[:10],
                             "layers": [{"layer": t.name, "kind": t.kind, "tactic": t.tactic, "ms": t.mean}
                                        for t in prof.layers]}
    result["accuracy"] = accuracy(spec.output_names, [outs[n] for n in spec.output_names], want)
    return result | median_ms(lambda: ctx.run(feeds), args.device, args.warmup, args.iterations)


def bench_peer(peer: str, spec, made, inputs: dict, args) -> dict:
    model, call_args = prepare(made.module, inputs, "fp16", args.device, spec.channels_last)
    call, first_s = runner(peer, model, call_args)
    result = {"first_call_seconds": first_s} | median_ms(call, args.device, args.warmup, args.iterations)
    torch._dynamo.reset()
    return result


def fp32_plan_bytes(path: Path, inputs: dict) -> dict:
    """The fp32 plan's size (a CPU build: the same weights in fp32, no tuning)."""
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    engine = kiln.build(path, kiln.BuildConfig.with_shapes(shapes, device="cpu", opt_level=0))
    return {"plan_bytes": len(engine.serialize())}


def prepare_model(name: str, args, budget: Budget) -> dict:
    """The model, its ONNX export and its fp32 plan size, made once for all batches."""
    spec, made = make_model(name, args.size_of(SPECS[name]))
    size = args.size_of(spec)
    path, _ = onnx_file(spec, made, size, args.cache)
    fp32 = budget.run(f"fp32-plan {name}", lambda: fp32_plan_bytes(path, spec.inputs(1, size)))
    return {"spec": spec, "made": made, "size": size, "path": path, "fp32": fp32}


def check_row(name: str, m: dict, batch: int, args, budget: Budget, rows: list, save) -> None:
    spec, made, size, path, fp32 = m["spec"], m["made"], m["size"], m["path"], m["fp32"]
    inputs = spec.inputs(batch, size, seed=1)
    row = {"model": name, "batch": batch, "size": size, "fp32_plan_bytes": fp32.get("plan_bytes")}
    rows.append(row)
    want = budget.run(f"torch-fp32 {name} b{batch}", lambda: {"outputs": fp32_reference(made, inputs, args.device)})
    if "outputs" not in want:
        row["error"] = f"torch fp32 reference: {want}"
        save()
        return
    for precision in args.precisions:
        row[f"kiln_{precision}"] = r = budget.run(
            f"kiln-{precision} {name} b{batch}",
            lambda: build_kiln(spec, path, inputs, want["outputs"], precision, args))
        if r.get("plan_bytes") and fp32.get("plan_bytes"):
            r["size_vs_fp32"] = r["plan_bytes"] / fp32["plan_bytes"]
        save()
    for peer in args.peers:
        row[f"torch_{peer}_fp16"] = budget.run(f"{peer} {name} b{batch}",
                                               lambda: bench_peer(peer, spec, made, inputs, args))
        save()
    best = min((v["median_ms"] for k, v in row.items() if k.startswith("torch_") and "median_ms" in v),
               default=None)
    for precision in args.precisions:
        r = row.get(f"kiln_{precision}", {})
        if best and r.get("median_ms"):
            r["speedup_vs_best_torch_fp16"] = best / r["median_ms"]
    save()


def table(rows: list) -> str:
    head = (f"{'model':9} {'b':>3} {'prec':5} {'cos(out0)':>10} {'max-rel':>8} {'ms':>8} {'best torch':>10} "
            f"{'speedup':>7} {'quantized':>9} {'size/fp32':>9}")
    lines = [head, "-" * len(head)]
    for row in rows:
        peers = [row.get(k, {}).get("median_ms") for k in row if k.startswith("torch_")]
        best = min([p for p in peers if p], default=None)
        for key in [k for k in row if k.startswith("kiln_")]:
            r = row[key]
            prec = key[5:]
            if "median_ms" not in r:
                why = r.get("error") or r.get("skipped") or "?"
                lines.append(f"{row['model']:9} {row['batch']:>3} {prec:5} {why[:90]}")
                continue
            acc = next(iter(r["accuracy"].values()))
            layers = f"{r['quantized_layers']}/{r['quantizable_layers']}" if "quantized_layers" in r else ""
            lines.append(f"{row['model']:9} {row['batch']:>3} {prec:5} {acc['cosine']:>10.5f} {acc['max_rel']:>8.3g} "
                         f"{r['median_ms']:>8.3f} {best or float('nan'):>10.3f} "
                         f"{r.get('speedup_vs_best_torch_fp16', float('nan')):>7.2f} {layers:>9} "
                         f"{r.get('size_vs_fp32', float('nan')):>9.3f}")
        if "error" in row:
            lines.append(f"{row['model']:9} {row['batch']:>3} {row['error'][:100]}")
    lines.append(f"targets: int8 (fp8) size/fp32 <= {SIZE_TARGET}; ResNet-50 b64 int8 speedup >= 2.5 vs best torch "
                 "fp16")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = parser(__doc__, required=True, out_help="folder for gpu_int8_check.json and the timing cache")
    p.add_argument("--budget-seconds", type=float, default=240.0)
    p.add_argument("--models", default="resnet50,minilm,bert")
    p.add_argument("--batches", default="64,1")
    p.add_argument("--precisions", default="int8,fp16", help="comma-separated: int8, fp8, fp16 (e.g. int8,fp8)")
    p.add_argument("--peers", default="eager,reduce-overhead")
    p.add_argument("--opt-level", type=int, default=3, help="kiln's default (3)")
    p.add_argument("--calibrator", default="entropy")
    p.add_argument("--smooth-alpha", type=float, default=0.0, help="SmoothQuant strength (BuildConfig.smooth_alpha)")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--profile", action="store_true", help="also time each layer of the quantized engines")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.precisions = [x for x in args.precisions.split(",") if x]
    args.peers = [x for x in args.peers.split(",") if x]
    args.size_of = lambda spec: args.image_size if spec.task == "image" else args.seq
    args.cache = ROOT / ".kiln-cache" / "benchmarks"
    args.out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_seconds)
    rows: list = []
    info = facts(args.device) | {"args": {k: str(v) for k, v in vars(args).items() if k != "size_of"}}

    def save():
        (args.out / "gpu_int8_check.json").write_text(json.dumps(info | {"rows": rows}, indent=1, default=str))

    models: dict[str, dict] = {}
    for batch in args.batches:  # every model at the first batch (64: the throughput targets) before the next
        for name in args.models:
            if not budget.allows(f"kiln-{args.precisions[0]}" if args.precisions else "kiln-int8"):
                rows.append({"model": name, "batch": batch, "error": "skipped: budget spent"})
                continue
            try:
                if name not in models:
                    models[name] = prepare_model(name, args, budget)
                check_row(name, models[name], batch, args, budget, rows, save)
            except Exception as e:  # the model could not be made or exported: the next one still runs
                print(traceback.format_exc()[-3000:], file=sys.stderr, flush=True)
                rows.append({"model": name, "batch": batch, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            save()
    info["seconds"] = budget.elapsed
    save()
    print(f"\nwrote {args.out / 'gpu_int8_check.json'} ({budget.elapsed:.0f} s)\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
