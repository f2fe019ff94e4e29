"""Where a cold build's compile + check time goes (issue 27 target 2), and what capping cuDNN's algorithm search
(torch.backends.cudnn.benchmark_limit, torch's default 10) or changing the compile threads (KILN_COMPILE_THREADS)
saves and costs: each model built at --batch in a fresh process with a fresh Triton cache and no timing cache, per
limit and thread count; build seconds, phases, compile + check thread-seconds per tactic, and the engine's median
call (ms, synchronized) on the same inputs. --precision int8 calibrates on 32 random samples (4 batches of 8).
--warm: each cold build fills a timing cache, and a second process then builds again with it and the same Triton
cache (a warm build).

    python -m benchmarks.probes.gpu_build_breakdown --models mobilenet_v2,resnet50 --limits 10,3 --out $OUT/bb.json
    python -m benchmarks.probes.gpu_build_breakdown --models resnet50 --precision int8 --batch 64 --threads 8,16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.probes.harness import calls_ms, parser, write_json

ONNX_CACHE = Path(tempfile.gettempdir()) / "kiln-build-breakdown-onnx"


def child(model: str, limit: int, precision: str, batch: int, timing_cache: str | None) -> dict:
    """One cold build of `model` at `batch` under `limit`, then 200 timed calls."""
    import kiln

    torch.backends.cudnn.benchmark_limit = limit
    spec = SPECS[model]
    path, _ = onnx_file(spec, instantiate(spec, spec.default_size), spec.default_size, ONNX_CACHE)
    inputs = spec.inputs(batch, spec.default_size)
    calib = [{k: v.numpy() for k, v in spec.inputs(8, spec.default_size, seed=100 + i).items()} for i in range(4)]
    engine = kiln.build(str(path), kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in inputs.items()},
                                                              device="cuda", fp16=True, opt_level=3,
                                                              int8=precision == "int8", timing_cache=timing_cache),
                        calib_data=calib if precision == "int8" else None)
    ctx = engine.create_context()
    feeds = {k: v.cuda() for k, v in inputs.items()}
    calls_ms(lambda: ctx.run(feeds), 30)
    info = engine.build_info
    return {"model": model, "precision": precision, "batch": batch, "benchmark_limit": limit,
            "compile_threads": os.environ.get("KILN_COMPILE_THREADS", "default"),
            "build_seconds": info["build_seconds"],
            "phases": info.get("build_phases"), "counts": info.get("build_counts"),
            "check_seconds_by_tactic": info.get("build_check_seconds"), "tactics": info.get("tactics"),
            "median_ms": float(np.median(calls_ms(lambda: ctx.run(feeds), 200)))}


def main() -> None:
    ap = parser(__doc__, out="build-breakdown.json")
    ap.add_argument("--models", default="mobilenet_v2,resnet50")
    ap.add_argument("--limits", default="10,3")
    ap.add_argument("--threads", default="default", help="KILN_COMPILE_THREADS values, e.g. 8,16")
    ap.add_argument("--precision", choices=("fp16", "int8"), default="fp16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warm", action="store_true", help="build each again with the cold build's caches")
    ap.add_argument("--timing-cache", help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "LIMIT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.precision, args.batch, args.timing_cache)))
        return
    rows = []
    for name in args.models.split(","):  # the export once, outside the timed children
        spec = SPECS[name]
        onnx_file(spec, instantiate(spec, spec.default_size), spec.default_size, ONNX_CACHE)
    runs = [(limit, threads, name) for limit in [int(x) for x in args.limits.split(",")]
            for threads in args.threads.split(",") for name in args.models.split(",")]
    for limit, threads, name in runs:
        caches = tempfile.mkdtemp(prefix="tc-")
        env = os.environ | {"TRITON_CACHE_DIR": caches}
        env |= {} if threads == "default" else {"KILN_COMPILE_THREADS": threads}
        for kind in ("cold", "warm") if args.warm else ("cold",):
            timing = ["--timing-cache", str(Path(caches) / "timing.sqlite")] if args.warm else []
            p = subprocess.run([sys.executable, "-m", "benchmarks.probes.gpu_build_breakdown", "--child", name,
                                str(limit), "--precision", args.precision, "--batch", str(args.batch), *timing],
                               env=env, capture_output=True, text=True)
            row = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else \
                {"model": name, "benchmark_limit": limit, "compile_threads": threads, "error": p.stderr[-2000:]}
            rows.append(row | {"build": kind})
            busy = list((row.get("check_seconds_by_tactic") or {}).items())[:4]
            print(f"{name} {args.precision} b{args.batch} limit {limit} threads {threads} {kind}: "
                  f"build {row.get('build_seconds', float('nan')):.1f} s, "
                  f"{row.get('median_ms', float('nan')):.3f} ms; " + ", ".join(f"{k} {s:.1f}" for k, s in busy)
                  + (f" ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
            write_json(args.out, {"rows": rows})  # after each row: a call cut off by its time limit keeps the rest

if __name__ == "__main__":
    sys.exit(main())
