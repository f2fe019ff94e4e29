"""What `kiln serve` adds over the engine alone at concurrency 1: median latency of the same tiny model called
in-process, over gRPC and over HTTP (binary and JSON) with tritonclient, on this machine (CPU or GPU); and the floors
under it: a TCP round trip between two processes (small, and with ResNet-50's and BERT-base's request / answer
sizes) and the server's health route and infer route over one raw keep-alive socket (no client library).

    python -m benchmarks.probes.serve_overhead --out DIR [--requests 300]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import socket
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


def _echo_server(sock: socket.socket) -> None:
    """Answer each request (an 8-byte length-prefixed header: request bytes, answer bytes) with that many bytes."""
    conn, _ = sock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while head := _read(conn, 8):
        up, down = int.from_bytes(head[:4], "little"), int.from_bytes(head[4:], "little")
        _read(conn, up)
        conn.sendall(bytes(down))


def _read(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return b""
        buf += chunk
    return bytes(buf)


def tcp_round_trips(sizes: dict[str, tuple[int, int]], n: int) -> dict[str, float]:
    """Median ms of a request / answer of (up, down) bytes over loopback TCP to another process."""
    listener = socket.create_server(("127.0.0.1", 0))
    proc = multiprocessing.get_context("fork").Process(target=_echo_server, args=(listener,), daemon=True)
    proc.start()
    conn = socket.create_connection(listener.getsockname())
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rows = {}
    try:
        for label, (up, down) in sizes.items():
            payload = up.to_bytes(4, "little") + down.to_bytes(4, "little") + bytes(up)

            def once(payload=payload, down=down):
                conn.sendall(payload)
                _read(conn, down)

            rows[label] = median_ms(once, n)
    finally:
        conn.close()
        proc.terminate()
    return rows


def http_round_trip(port: int, request: bytes, n: int) -> float:
    """Median ms of `request` (a whole HTTP/1.1 request) answered over one keep-alive socket."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def once():
        conn.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += conn.recv(65536)
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(rest) < length:
            rest += conn.recv(65536)
        assert head.startswith(b"HTTP/1.1 200"), head[:80]

    try:
        return median_ms(once, n)
    finally:
        conn.close()


def raw_infer_request(model: str, name: str, x: np.ndarray, output: str) -> bytes:
    """A binary-tensor infer request for one FP32 input, its output asked for in binary."""
    header = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": output, "parameters": {"binary_data": True}}]}).encode()
    body = header + x.tobytes()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


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
    rows.update({f"TCP round trip, {k}": v for k, v in tcp_round_trips(
        {"64 B / 64 B": (64, 64), "602 KB / 4 KB (ResNet-50)": (602_112, 4_000),
         "3 KB / 396 KB (BERT-base)": (3_072, 396_288)}, args.requests).items()})
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
        rows["HTTP health, raw socket"] = http_round_trip(18431, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
                                                          args.requests)
        rows["HTTP infer, raw socket"] = http_round_trip(18431, raw_infer_request("softmax", "logits", x, "probs"),
                                                         args.requests)
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
