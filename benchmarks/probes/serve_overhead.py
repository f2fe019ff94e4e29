"""What `kiln serve` adds over the engine alone at concurrency 1: median latency of the same tiny model called
in-process, over gRPC and over HTTP (binary and JSON) with tritonclient, on this machine (CPU or GPU).

    python -m benchmarks.probes.serve_overhead --out DIR [--requests 300]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def median_ms(fn, n: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def main() -> None:
    import tritonclient.grpc as gc
    import tritonclient.http as hc

    import kiln

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp()) / "models"
    subprocess.run([sys.executable, "examples/make_repository.py", str(root)], check=True, capture_output=True)
    x = np.random.default_rng(0).normal(size=(1, 3)).astype(np.float32)  # the softmax model reads "logits"
    engine = kiln.build(str(root / "softmax" / "1" / "model.onnx"), kiln.BuildConfig(device=args.device))
    ctx = engine.create_context()
    rows = {"engine alone": median_ms(lambda: ctx.run({"logits": x}), args.requests)}
    command = [sys.executable, "-m", "kiln", "serve", str(root), "--http-port", "18431", "--grpc-port", "18432",
               "--metrics-port", "-1", "--device", args.device]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        while "gRPC on" not in proc.stderr.readline():
            pass
        g, h = gc.InferenceServerClient("127.0.0.1:18432"), hc.InferenceServerClient("127.0.0.1:18431")
        gi = gc.InferInput("logits", [1, 3], "FP32")
        gi.set_data_from_numpy(x)
        rows["gRPC"] = median_ms(lambda: g.infer("softmax", [gi]), args.requests)
        for binary in (True, False):
            hi = hc.InferInput("logits", [1, 3], "FP32")
            hi.set_data_from_numpy(x, binary_data=binary)
            rows[f"HTTP {'binary' if binary else 'JSON'}"] = median_ms(lambda: h.infer("softmax", [hi]), args.requests)
    finally:
        proc.terminate()
        proc.wait(30)
    info = {"what": "median ms per request at concurrency 1, softmax over [1, 3] (examples/make_repository.py)",
            "device": args.device, "cpu": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
            "kiln": kiln.__version__, "median_ms": {k: round(v, 3) for k, v in rows.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"serve-overhead-{args.device}-{info['date']}.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
