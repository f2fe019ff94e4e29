"""How long a serving batch's input gather takes while another thread keeps Python's lock busy (the event loop under
load): `staging.gather` (one torch.cat) against a numpy copy per request and np.concatenate, on this machine's CPU.

    python -m benchmarks.probes.serve_gather [--requests 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np
import torch

from kiln.serve.staging import gather


def per_call_ms(fn, n: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=15, help="ResNet-50 inputs (1x3x224x224 fp32) in the batch")
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    ap.add_argument("--switch-us", type=float, default=100.0, help="sys.setswitchinterval, as kiln serve's default")
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sys.setswitchinterval(a.switch_us / 1e6)
    rng = np.random.default_rng(0)
    parts = [np.frombuffer(rng.random((1, 3, 224, 224), np.float32).tobytes(), np.float32).reshape(1, 3, 224, 224)
             for _ in range(a.requests)]  # read-only, as a request's bytes are
    dest = np.empty((64, 3, 224, 224), np.float32)

    def per_request():
        for i, p in enumerate(parts):
            dest[i:i + 1] = p

    ways = {"gather (torch.cat)": lambda: gather(parts, dest), "numpy copy per request": per_request,
            "np.concatenate": lambda: np.concatenate(parts)}
    out = {"what": f"ms to gather {a.requests} ResNet-50 inputs", "torch_threads": a.threads,
           "date": time.strftime("%Y-%m-%d")}
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            pass

    for label, busy_on in (("idle", False), ("lock busy", True)):
        thread = threading.Thread(target=busy, daemon=True) if busy_on else None
        if thread:
            thread.start()
        out[label] = {k: round(per_call_ms(fn, a.calls), 3) for k, fn in ways.items()}
        if thread:
            stop.set()
            thread.join()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
