"""Plans across GPU models: the cost of --hardware-compat, and strict / warn / retune on another GPU.

    # on GPU A (e.g. an H100): build MobileNetV2 fp16 batch 8 with hardware-compat none and portable
    python -m benchmarks.probes.gpu_compat_check --out DIR
    # copy DIR to GPU B (e.g. an H200), then load A's plans there under each policy and compare with a native build
    python -m benchmarks.probes.gpu_compat_check --load DIR [--out DIR2]

Build mode writes DIR/mobilenetv2.onnx, DIR/mobilenetv2-<gpu>-{none,portable}.plan, DIR/timing-<gpu>.db and
DIR/compat-build-<gpu>.json. Load mode writes compat-load-<gpu>.json (and the re-tuned plans) into --out
(default: DIR). Each mode prints a summary table last and takes a few minutes at most.
"""

from __future__ import annotations

import json
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch


import kiln
from benchmarks.probes.harness import facts, parser
from kiln.engine import plan as planfile
from kiln.engine.compat import CompatibilityWarning
from kiln.errors import EngineCompatibilityError
from kiln.target import detect

BATCH = 8
SHAPE = (BATCH, 3, 224, 224)
MAX_PLAN_BYTES = 16 << 20


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def model_path(folder: Path) -> Path:
    """MobileNetV2 (random weights, calibrated BatchNorm statistics) exported once to folder/mobilenetv2.onnx."""
    path = folder / "mobilenetv2.onnx"
    if not path.exists():
        from tests.models.export import export
        from tests.models.vision import MobileNetV2, randomize_bn

        torch.manual_seed(0)
        export(randomize_bn(MobileNetV2()), (torch.randn(1, 3, 224, 224),), path, dynamo=False,
               input_names=["input"], output_names=["logits"],
               dynamic_axes={"input": {0: "batch", 2: "height", 3: "width"}})
    return path


def median_ms(engine: kiln.Engine, x: torch.Tensor, iters: int = 200, warmup: int = 20) -> tuple[float, np.ndarray]:
    """Median milliseconds of one inference (CUDA events), and the output (for cross-checks)."""
    ctx = engine.create_context()
    if not x.is_cuda:  # --device cpu: a dry run of the flow, a few untimed-quality iterations
        iters, warmup = 2, 1
    for _ in range(warmup):
        out = ctx.run({"input": x})
    times = []
    for _ in range(iters):
        if not x.is_cuda:
            t0 = time.perf_counter()
            ctx.run({"input": x})
            times.append((time.perf_counter() - t0) * 1e3)
            continue
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        ctx.run({"input": x})
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    y = out["logits"]
    return float(np.median(times)), (y.float().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def config(cache: Path, compat: str, opt_level: int, device: str) -> kiln.BuildConfig:
    return kiln.BuildConfig.with_shapes({"input": input_shape(device)}, fp16=True, device=device,
                                        timing_cache=str(cache), hardware_compat=compat, opt_level=opt_level)


def input_shape(device: str) -> tuple[int, ...]:
    return SHAPE if device == "cuda" else (1, 3, 64, 64)  # the CPU dry run keeps the reference kernels quick


def gpu_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else detect("cpu").name


def table(title: str, cols: list[str], rows: list[list]) -> None:
    cells = [[str(c) for c in cols]] + [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def build_mode(out: Path, opt_level: int, device: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gpu = gpu_name(device)
    tag = slug(gpu)
    onnx_path = model_path(out)
    cache = out / f"timing-{tag}.db"
    cache.unlink(missing_ok=True)  # cold: the build times below include tuning every layer
    x = torch.randn(input_shape(device), device=device)
    rows, results = [], facts(device) | {"device": gpu, "model": "MobileNetV2 fp16 batch 8", "opt_level": opt_level,
                                         "plans": {}}
    outputs = {}
    for compat in ("none", "portable"):
        t0 = time.perf_counter()
        engine = kiln.build(onnx_path, config(cache, compat, opt_level, device))
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        kiln.build(onnx_path, config(cache, compat, opt_level, device))  # warm timing cache: what a re-tune costs
        warm = time.perf_counter() - t0
        plan = out / f"mobilenetv2-{tag}-{compat}.plan"
        engine.save(plan)
        ms, outputs[compat] = median_ms(engine, x)
        size = plan.stat().st_size
        results["plans"][compat] = {"plan": plan.name, "plan_bytes": size, "build_s": cold, "build_warm_cache_s": warm,
                                    "tune_s": engine.build_info["stage_seconds"].get("tune"), "median_ms": ms,
                                    "tactics": engine.tactic_summary()}
        rows.append([compat, cold, warm, ms, f"{size / 2**20:.1f} MiB" + (" (OVER 16 MiB)" if size > MAX_PLAN_BYTES
                                                                           else "")])
    none, portable = results["plans"]["none"], results["plans"]["portable"]
    results["portable_cost_ratio"] = portable["median_ms"] / none["median_ms"]
    results["cosine_portable_vs_none"] = cosine(outputs["portable"], outputs["none"])
    (out / f"compat-build-{tag}.json").write_text(json.dumps(results, indent=1))
    print(f"tactics none: {none['tactics']}\ntactics portable: {portable['tactics']}")
    table(f"hardware-compat cost on {gpu} (MobileNetV2 fp16, batch 8)",
          ["compat", "build s (cold cache)", "build s (warm cache)", "median ms", "plan"], rows)
    print(f"portable / none latency: {results['portable_cost_ratio']:.3f}   "
          f"(outputs cosine {results['cosine_portable_vs_none']:.6f})")
    print(f"next: copy {out} to another GPU model and run: python -m benchmarks.probes.gpu_compat_check "
          f"--load {out}")


def load_mode(folder: Path, out: Path, opt_level: int, device: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gpu = gpu_name(device)
    tag = slug(gpu)
    foreign = sorted(p for p in folder.glob("mobilenetv2-*.plan")
                     if planfile.read_header(p).get("device", {}).get("name") != gpu
                     and "retuned" not in p.name)
    if not foreign:
        sys.exit(f"no plan built on another GPU in {folder}; build them there with --out {folder}")
    x = torch.randn(input_shape(device), device=device)
    cache = out / f"timing-{tag}.db"
    cache.unlink(missing_ok=True)
    onnx_path = model_path(folder)
    t0 = time.perf_counter()
    native = kiln.build(onnx_path, config(cache, "none", opt_level, device))
    native_build = time.perf_counter() - t0
    native_ms, native_y = median_ms(native, x)
    results = facts(device) | {"device": gpu, "native": {"build_s": native_build, "median_ms": native_ms}, "plans": {}}
    rows = []
    for p in foreign:
        h = planfile.read_header(p)
        r = {"built_on": h["device"].get("name"), "hardware_compat": h.get("hardware_compat")}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CompatibilityWarning)
            try:
                kiln.load(p)
                r["strict"] = "loaded"
            except EngineCompatibilityError as e:
                r["strict"] = "refused"
                r["strict_message"] = str(e)
        r["strict_warnings"] = [str(w.message) for w in caught]
        print(f"\n== {p.name} (built on {r['built_on']}, hardware-compat {r['hardware_compat']})")
        print(f"strict: {r['strict']}: {r.get('strict_message') or (r['strict_warnings'] or [''])[0]}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CompatibilityWarning)
            warn_engine = kiln.load(p, policy="warn")
        r["warn_ms"], warn_y = median_ms(warn_engine, x)
        del warn_engine
        retune_cache = out / f"timing-{tag}-retune.db"
        retune_cache.unlink(missing_ok=True)
        for which in ("cold", "warm"):  # cold: an empty timing cache; warm: the one the cold run filled
            t0 = time.perf_counter()
            tuned = kiln.load(p, policy="retune", timing_cache=retune_cache)
            r[f"retune_{which}_s"] = time.perf_counter() - t0
        retuned = out / p.name.replace(".plan", f"-retuned-{tag}.plan")
        tuned.save(retuned)
        again = kiln.load(retuned)  # strict: the re-tuned plan carries this GPU's fingerprint
        r["retuned_plan"], r["retuned_strict"] = retuned.name, "loaded"
        r["retune_changed_layers"] = tuned.build_info["retune"]["changed"]
        r["retuned_ms"], tuned_y = median_ms(again, x)
        r["cosine_warn_vs_native"], r["cosine_retuned_vs_native"] = cosine(warn_y, native_y), cosine(tuned_y, native_y)
        results["plans"][p.name] = r
        rows.append([p.name, r["hardware_compat"], r["strict"], r["warn_ms"], r["retune_cold_s"], r["retune_warm_s"],
                     r["retuned_ms"], native_ms, r["warn_ms"] / native_ms, r["retuned_ms"] / native_ms])
    (out / f"compat-load-{tag}.json").write_text(json.dumps(results, indent=1))
    table(f"plans from another GPU on {gpu} (native build {native_build:.1f} s, cold timing cache)",
          ["plan", "compat", "strict", "warn ms", "retune s cold", "retune s warm", "retuned ms", "native ms",
           "warn/native", "retuned/native"], rows)


def main() -> None:
    ap = parser(__doc__, out_help="build mode: folder for the model, plans, timing cache and JSON; "
                                  "load mode: folder for results (default: the --load folder)")
    ap.add_argument("--load", type=Path, help="load the plans another GPU built into this folder")
    ap.add_argument("--opt-level", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the flow (no meaningful timings)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --device cpu for a dry run)")
    print(f"device: {gpu_name(args.device)}, torch {torch.__version__}, kiln {kiln.__version__}", flush=True)
    if args.load:
        load_mode(args.load, args.out or args.load, args.opt_level, args.device)
    elif args.out:
        build_mode(args.out, args.opt_level, args.device)
    else:
        ap.error("give --out DIR (build) or --load DIR (load plans built on another GPU)")


if __name__ == "__main__":
    main()
