"""What `kiln serve --frontends`' link costs: one engine process (ModelRepository + LinkServer) and one front-end
process driving `LinkedModel.infer` at a fixed concurrency (no HTTP), on the tiny softmax model of
examples/make_repository.py; requests/s, each process's CPU µs a request, and the same model called in-process.

    python -m benchmarks.probes.serve_link [--seconds 6] [--concurrency 64] [--device cpu] [--profile]

`--profile` prints the engine's event-loop profile (cProfile, its main thread only)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODEL, FEEDS = "softmax", {"logits": np.ones((1, 3), np.float32)}


async def drive(model, seconds: float, concurrency: int) -> int:
    """Requests answered by `concurrency` tasks calling `model.infer` for `seconds`."""
    done, end = [0], time.monotonic() + seconds

    async def client():
        while time.monotonic() < end:
            await model.infer(dict(FEEDS))
            done[0] += 1
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done[0]


async def engine(args, fd: int) -> None:
    from kiln.serve.link import LinkSpec
    from kiln.serve.link_server import LinkServer
    from kiln.serve.repository import ModelRepository

    repo = ModelRepository(args.root, device=args.device, inline_us=args.inline_us)
    repo.start()
    direct = await drive(repo.get(MODEL), 2.0, args.concurrency) / 2.0  # the same model, no link
    server = LinkServer(repo, LinkSpec(args.sock, (fd,)))
    await server.start()
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    count = lambda: repo.get(MODEL).statistics()["inference_stats"]["success"]["count"]  # noqa: E731
    start, before = time.process_time(), count()
    await asyncio.sleep(args.seconds + 2.0)  # the front end connects, warms up 1 s, runs `seconds`
    cpu, answered = time.process_time() - start, count() - before
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    print(json.dumps({"engine_cpu_s": cpu, "answered": answered, "direct_per_s": direct}), flush=True)
    await asyncio.sleep(3.0)
    await repo.close()
    await server.close()


async def front(args, fd: int) -> None:
    from kiln.serve.link import LinkSpec
    from kiln.serve.linked import LinkedRepository

    repo = LinkedRepository(args.root, LinkSpec(args.sock, (fd,), frontend=0))
    await repo.start()
    await drive(repo.get(MODEL), 1.0, args.concurrency)
    start, cpu = time.monotonic(), time.process_time()
    n = await drive(repo.get(MODEL), args.seconds, args.concurrency)
    print(json.dumps({"requests": n, "seconds": time.monotonic() - start, "front_cpu_s": time.process_time() - cpu}),
          flush=True)
    await repo.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--inline-us", type=int, default=1000, help="kiln serve --inline-us of the engine process")
    ap.add_argument("--role", choices=["engine", "front"], help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--sock", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        asyncio.run((engine if args.role == "engine" else front)(args, args.fd))
        return
    from kiln.serve.link import DEFAULT_SLOT_BYTES, DEFAULT_SLOTS, memfd

    tmp = Path(tempfile.mkdtemp(prefix="kiln-link-probe-"))
    root = tmp / "models"
    subprocess.run([sys.executable, "examples/make_repository.py", str(root)], check=True, capture_output=True)
    fd = memfd("probe", DEFAULT_SLOTS * DEFAULT_SLOT_BYTES)
    common = [sys.executable, "-m", "benchmarks.probes.serve_link", "--root", str(root), "--sock", str(tmp / "e.sock"),
              "--fd", str(fd), "--seconds", str(args.seconds), "--concurrency", str(args.concurrency), "--device",
              args.device, "--inline-us", str(args.inline_us), *(["--profile"] if args.profile else [])]
    eng = subprocess.Popen([*common, "--role", "engine"], pass_fds=[fd], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    fr = subprocess.Popen([*common, "--role", "front"], pass_fds=[fd], stdout=subprocess.PIPE, text=True)
    f, e = json.loads(fr.communicate()[0]), json.loads(eng.communicate()[0])
    os.close(fd)
    n = f["requests"]
    print(json.dumps({"what": f"link at concurrency {args.concurrency}, {MODEL} [1, 3] on {args.device}",
                      "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
                      "requests_per_s": round(n / f["seconds"]), "in_process_per_s": round(e["direct_per_s"]),
                      "engine_cpu_us_per_request": round(e["engine_cpu_s"] / e["answered"] * 1e6, 1),
                      "front_cpu_us_per_request": round(f["front_cpu_s"] / n * 1e6, 1)}, indent=1))


if __name__ == "__main__":
    main()
