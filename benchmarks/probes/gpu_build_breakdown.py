"""Where a cold fp16 build's compile + check time goes (issue 27 target 2), and what capping cuDNN's algorithm search
(torch.backends.cudnn.benchmark_limit, torch's default 10) saves and costs: each model built at batch 1 in a fresh
process with a fresh Triton cache and no timing cache, per limit; build seconds, phases, compile + check
thread-seconds per tactic, and the engine's median call (ms, synchronized) on the same inputs.

    python -m benchmarks.probes.gpu_build_breakdown --models mobilenet_v2,resnet50 --limits 10,3 --out $OUT/bb.json
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


def child(model: str, limit: int) -> dict:
    """One cold build of `model` at batch 1 under `limit`, then 200 timed calls."""
    import kiln

    torch.backends.cudnn.benchmark_limit = limit
    spec = SPECS[model]
    path, _ = onnx_file(spec, instantiate(spec, spec.default_size), spec.default_size, ONNX_CACHE)
    inputs = spec.inputs(1, spec.default_size)
    engine = kiln.build(str(path), kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in inputs.items()},
                                                              device="cuda", fp16=True, opt_level=3))
    ctx = engine.create_context()
    feeds = {k: v.cuda() for k, v in inputs.items()}
    calls_ms(lambda: ctx.run(feeds), 30)
    info = engine.build_info
    return {"model": model, "benchmark_limit": limit, "build_seconds": info["build_seconds"],
            "phases": info.get("build_phases"), "counts": info.get("build_counts"),
            "check_seconds_by_tactic": info.get("build_check_seconds"), "tactics": info.get("tactics"),
            "median_ms": float(np.median(calls_ms(lambda: ctx.run(feeds), 200)))}


def main() -> None:
    ap = parser(__doc__, out="build-breakdown.json")
    ap.add_argument("--models", default="mobilenet_v2,resnet50")
    ap.add_argument("--limits", default="10,3")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "LIMIT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    rows = []
    for name in args.models.split(","):  # the export once, outside the timed children
        spec = SPECS[name]
        onnx_file(spec, instantiate(spec, spec.default_size), spec.default_size, ONNX_CACHE)
    for limit in [int(x) for x in args.limits.split(",")]:
        for name in args.models.split(","):
            env = os.environ | {"TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="tc-")}
            p = subprocess.run([sys.executable, "-m", "benchmarks.probes.gpu_build_breakdown", "--child", name,
                                str(limit)], env=env, capture_output=True, text=True)
            row = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else \
                {"model": name, "benchmark_limit": limit, "error": p.stderr[-2000:]}
            rows.append(row)
            busy = list((row.get("check_seconds_by_tactic") or {}).items())[:4]
            print(f"{name} limit {limit}: build {row.get('build_seconds', float('nan')):.1f} s, "
                  f"{row.get('median_ms', float('nan')):.3f} ms; " + ", ".join(f"{k} {s:.1f}" for k, s in busy)
                  + (f" ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
            write_json(args.out, {"rows": rows})  # after each row: a call cut off by its time limit keeps the rest


if __name__ == "__main__":
    sys.exit(main())
