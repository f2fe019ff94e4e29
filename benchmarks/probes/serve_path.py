"""The infer route's own cost, no socket: median µs per request through kiln serve's ASGI app in-process (the
examples' softmax model on the CPU engine, binary tensors), the engine call on the event loop (`--inline-us`) and on
its thread; `--profile` adds cProfile's top functions. Compare with serve_overhead's raw-socket figures.

    python -m benchmarks.probes.serve_path [--requests 3000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _request(header: bytes, body: bytes) -> tuple[dict, list]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v2/models/softmax/infer", "raw_path": b"/v2/models/softmax/infer", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"host", b"x"), (b"content-type", b"application/octet-stream"),
                         (b"inference-header-content-length", str(len(header)).encode()),
                         (b"content-length", str(len(body)).encode())]}
    return scope, [{"type": "http.request", "body": body, "more_body": False}]


async def _measure(app, scope, message, n: int, profile: cProfile.Profile | None) -> float:
    """Median µs of `n` requests (after 300 warm-up ones); then, with `profile`, `n` more under it."""
    async def one():
        messages, gone = [message], asyncio.get_running_loop().create_future()

        async def receive():
            if messages:
                return messages.pop()
            await gone  # the disconnect watcher waits here until cancelled

        sent = []

        async def send(m):
            sent.append(m)

        await app(scope, receive, send)
        gone.cancel()
        assert sent[0]["status"] == 200, sent
    for _ in range(300):
        await one()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await one()
        times.append(time.perf_counter() - t)
    if profile is not None:  # a pass of its own: cProfile's overhead stays out of the timing
        profile.enable()
        for _ in range(n):
            await one()
        profile.disable()
    return float(np.median(times) * 1e6)


def main() -> None:
    from kiln.serve.http import create_app
    from kiln.serve.repository import ModelRepository

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp()) / "models"
    subprocess.run([sys.executable, "examples/make_repository.py", str(root)], check=True, capture_output=True)
    x = np.zeros((1, 3), np.float32)
    header = json.dumps({"inputs": [{"name": "logits", "shape": [1, 3], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "probs", "parameters": {"binary_data": True}}]}).encode()
    scope, (message,) = _request(header, header + x.tobytes())
    rows = {}
    for inline_us in (1000, 0):
        repo = ModelRepository(root, device="cpu", inline_us=inline_us)
        repo.start()
        profile = cProfile.Profile() if args.profile and inline_us else None
        rows[f"ASGI infer, inline_us {inline_us}"] = asyncio.run(
            _measure(create_app(repo), scope, message, args.requests, profile))
        if profile is not None:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(20)
            print(out.getvalue())
    print(json.dumps({"what": "median µs per request, in-process ASGI, softmax [1, 3] on the CPU engine",
                      "median_us": {k: round(v, 1) for k, v in rows.items()}}, indent=2))


if __name__ == "__main__":
    main()
