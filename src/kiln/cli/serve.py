"""`kiln serve MODEL_REPOSITORY`: a KServe v2 / Triton-compatible inference server (HTTP and gRPC in one loop), or
with `--ray` the same HTTP routes deployed on Ray Serve (kiln.serve.ray_app) over several replicas."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from kiln.cli.errors import command
from kiln.cli.options import Device, Policy, Verbose
from kiln.serve import INLINE_US
from kiln.serve.ray_app import DEFAULT_TARGET_ONGOING  # a constant: kiln.serve.ray_app imports Ray only when used

GRACE_S = 30.0

# `kiln serve --help`'s epilog: every field of MODEL/config.toml (typer joins single newlines; "\[" is a bracket)
CONFIG_HELP = r"""MODEL/config.toml fields (every one optional; without a file the config is read from the model):

name: the served name (default: the folder's). platform: reported in the model metadata. precision: fp32, fp16,
bf16, int8 or fp8, for a model.onnx built on load (cached beside it). \[\[profiles]]: one table per optimization profile
of that build, INPUT = {min = \[1, 4], opt = \[4, 4], max = \[64, 4]}.

max_batch_size: the most rows one engine call takes; 0: no batch dim, requests never merge (default: the model's
dynamic first dim allows batching). input / output: lists of {name, data_type (FP32, TYPE_FP32, ...), dims (without
the batch dim; -1: any size)}, checked against the engine. instance_count (or Triton's instance_group = \[{count}]):
execution contexts serving one queue. version_policy: {latest = {num_versions = N}}, {all = {}} or {specific =
{versions = \[...]}}.

\[dynamic_batching] preferred_batch_size: batch sizes formed first. max_queue_delay_microseconds: how long the
oldest request waits for more. max_queue_size: requests waiting at most (0: no limit), beyond it reject_status (503
or 429). default_timeout_microseconds: a request still queued after it gets 504. batch_buckets: row counts a batch is
padded up to (default on a GPU: the powers of two, the preferred sizes and max_batch_size). warmup: run every
instance once at each bucket on load, so no request pays a bucket's first call (default: on where there are buckets
and no padding).

\[dynamic_batching.padding] axis: the axis (besides the batch) that requests may differ along. inputs: {INPUT = pad
value} of the inputs padded along it. outputs: the outputs cut back to each request's length. length_multiple:
padded lengths are rounded up to it (default 16 on a GPU)."""


def _port(flag: str, what: str):
    return Annotated[int, typer.Option(flag, min=-1, max=65535,
                                       help=f"{what} port (0: a free one, said on stderr; -1: off).")]


HttpPort = _port("--http-port", "HTTP (KServe v2 REST)")
GrpcPort = _port("--grpc-port", "gRPC (KServe v2)")
MetricsPort = _port("--metrics-port", "Prometheus metrics (GET /metrics; the HTTP port serves it too)")


@command
def serve(
    repository: Annotated[Path, typer.Argument(help="Model repository: MODEL/config.toml (optional) and "
                                                    "MODEL/VERSION/model.plan or model.onnx.", show_default=False)],
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface).")]
    = "127.0.0.1",
    http_port: HttpPort = 8000,
    grpc_port: GrpcPort = 8001,
    metrics_port: MetricsPort = 8002,
    device: Device = "auto",
    policy: Policy = "strict",
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", min=1,
                                                help="Largest HTTP request body (and gRPC message) accepted.")]
    = 64 << 20,
    shared_memory: Annotated[bool, typer.Option(
        "--shared-memory", help="Serve Triton's system and CUDA shared memory extensions (HTTP and gRPC): clients "
                                "register POSIX shared memory objects (/dev/shm) or, on a GPU server, device "
                                "allocations by CUDA IPC handle (pip install 'kiln[serve-cuda]'), and pass tensors "
                                "through them instead of the socket; inputs in CUDA regions are batched on the GPU, "
                                "never copied to the host. Off by default, as Triton's --allow-client-shm: a client "
                                "may then map and read or write any shared memory object this server's user can "
                                "open.")] = False,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Scale out with Ray Serve: replicas that each load every model serve the v2 HTTP routes on "
                      "--http-port through Ray's proxy (HTTP only: no gRPC nor --metrics-port; each reply names its "
                      "replica in a Kiln-Replica header). One GPU per replica on cuda, one CPU otherwise. Needs "
                      "pip install 'ray\\[serve]'.")] = False,
    replicas: Annotated[Optional[int], typer.Option(
        "--replicas", min=1, help="With --ray: this many replicas (default 1).", show_default=False)] = None,
    autoscale: Annotated[Optional[str], typer.Option(
        "--autoscale", metavar="MIN:MAX", help="With --ray: autoscale between MIN and MAX replicas on the requests "
                                               f"in flight per replica (target {DEFAULT_TARGET_ONGOING:g}).",
        show_default=False)] = None,
    gpus_per_replica: Annotated[Optional[float], typer.Option(
        "--gpus-per-replica", metavar="F", help="With --ray on cuda: the share of a GPU each replica takes (default 1; "
                                                "0.25: four replicas, four processes, share one GPU).",
        show_default=False)] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", metavar="ADDR", help="With --ray: join the Ray cluster at ADDR (host:6379 from `ray start "
                                              "--head`, or auto) instead of starting a local one; on exit only "
                                              "kiln's application is deleted.", show_default=False)] = None,
    loop: Annotated[str, typer.Option(
        "--loop", help="The event loop HTTP, gRPC and the batcher share: auto (uvloop when installed: ~5 % more "
                       "requests/s on a CPU), uvloop or asyncio (Python's).")] = "auto",
    gil_switch_us: Annotated[int, typer.Option(
        "--gil-switch-us", min=1, help="Python's thread switch interval in microseconds (sys.setswitchinterval): "
                                       "how long the busy event loop may keep Python's lock while an engine thread "
                                       "waits for it. Python's default, 5000, leaves engine calls waiting for the "
                                       "front end under load.")] = 100,
    host_threads: Annotated[int, typer.Option(
        "--host-threads", min=0, help="torch's CPU threads in each server process; 0: one when the models run on a "
                                      "GPU (the host only copies batches, and a thread team stalls on a loaded "
                                      "machine), torch's default on the CPU.")] = 0,
    inline_us: Annotated[int, typer.Option(
        "--inline-us", min=0, help="A lone request (nothing else queued or running for its model) runs on the event "
                                   "loop instead of an engine thread, saving two thread hand-offs (0.1-0.2 ms), when "
                                   "its shape's last lone run took at most this many microseconds and requests "
                                   "arrive further apart than that run takes; a shape's first run always takes a "
                                   "thread. 0: always a thread.")] = INLINE_US,
    log_format: Annotated[str, typer.Option(
        "--log-format", help="Server logs on stderr: text ('kiln serve: ...') or json (one object per line: time, "
                             "level, logger, message, event fields).")] = "text",
    log_requests: Annotated[bool, typer.Option(
        "--log-requests", help="Also log every inference: model, version, status, milliseconds.")] = False,
    workers: Annotated[int, typer.Option(
        "--workers", min=1, help="Serve from this many processes, each loading every model (N engine copies on the "
                                 "device, N batching queues): one Python process takes in one to two thousand "
                                 "requests a second. The kernel spreads HTTP and gRPC connections over them; /metrics "
                                 "and the v2 statistics sum every worker's (the other workers' statistics lag by up to "
                                 "0.2 s); model load / unload need --workers 1, --shared-memory one worker or "
                                 "--frontends.")] = 1,
    frontends: Annotated[int, typer.Option(
        "--frontends", min=0, help="Take requests in this many front-end processes that hand them to one engine "
                                   "process (one engine copy and one batching queue per model, so batches fill up), "
                                   "tensors through shared memory: for more requests a second than one process "
                                   "takes in. The kernel spreads HTTP and gRPC connections over the front ends; "
                                   "statistics lag by up to 0.2 s; model load / unload need one process. With "
                                   "--shared-memory the engine process keeps the regions and reads and writes them. "
                                   "0: off.")] = 0,
    link_path: Annotated[Optional[str], typer.Option("--link", hidden=True)] = None,
    link_fds: Annotated[Optional[str], typer.Option("--link-fds", hidden=True)] = None,
    frontend_index: Annotated[Optional[int], typer.Option("--frontend-index", hidden=True)] = None,
    worker_index: Annotated[Optional[int], typer.Option("--worker-index", hidden=True)] = None,
    http_fd: Annotated[Optional[int], typer.Option("--http-fd", hidden=True)] = None,
    metrics_fd: Annotated[Optional[int], typer.Option("--metrics-fd", hidden=True)] = None,
    verbose: Verbose = False,
) -> None:
    """Serve every model of MODEL_REPOSITORY over the KServe v2 protocol (tritonclient works as is) until SIGINT or
    SIGTERM, which stop new requests and let those in flight finish."""
    import asyncio

    from kiln.errors import ConfigError

    from kiln.serve import logs

    if loop not in ("auto", "asyncio", "uvloop"):
        raise ConfigError(f"--loop {loop!r}: choose auto, asyncio or uvloop")
    if log_format not in logs.FORMATS:
        raise ConfigError(f"--log-format {log_format!r}: choose {' or '.join(logs.FORMATS)}")
    logs.configure(log_format, log_requests)
    if not repository.is_dir():
        raise ConfigError(f"model repository {repository} is not a folder")
    if not ray:
        for flag, value in (("--replicas", replicas), ("--autoscale", autoscale), ("--ray-address", ray_address),
                            ("--gpus-per-replica", gpus_per_replica)):
            if value is not None:
                raise ConfigError(f"{flag} needs --ray")
    if ray:
        if shared_memory:
            raise ConfigError("--shared-memory is not served under --ray (each replica is its own process)")
        if http_port < 0:
            raise ConfigError("--ray serves HTTP only: --http-port -1 leaves nothing to serve")
        _serve_ray(repository, host, http_port, device, policy, max_body_bytes, replicas, autoscale, ray_address,
                   gpus_per_replica)
        return
    if http_port < 0 and grpc_port < 0 and link_path is None:
        raise ConfigError("--http-port -1 and --grpc-port -1 leave nothing to serve")
    if frontends:
        if workers > 1:
            raise ConfigError("--frontends and --workers are two ways to serve from several processes; choose one")
    if workers > 1 or frontends:
        if shared_memory and not frontends:
            raise ConfigError("--shared-memory needs --workers 1 (or --frontends N, whose engine process keeps the "
                              "regions): each worker would keep its own regions, and a client's connections may "
                              "reach different workers")
        argv = ["--device", device, "--policy", policy, "--max-body-bytes", str(max_body_bytes), "--loop", loop,
                "--gil-switch-us", str(gil_switch_us), "--host-threads", str(host_threads), "--log-format", log_format,
                "--inline-us", str(inline_us)]
        argv += ["--log-requests"] * log_requests + ["--verbose"] * verbose + ["--shared-memory"] * shared_memory
        if frontends:
            raise typer.Exit(_serve_frontends(repository, host, http_port, grpc_port, metrics_port, frontends, argv))
        raise typer.Exit(_serve_workers(repository, host, http_port, grpc_port, metrics_port, workers, argv))
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise ConfigError("--loop uvloop needs uvloop: pip install uvloop (or --loop asyncio)") from None
        uvloop = None
    sys.setswitchinterval(gil_switch_us / 1e6)
    _set_host_threads(host_threads, device)
    worker = None if worker_index is None else Worker(worker_index, {"HTTP": http_fd, "metrics": metrics_fd})
    link = None
    if link_path is not None:
        from kiln.serve.link import LinkSpec

        link = LinkSpec(link_path, tuple(int(fd) for fd in (link_fds or "").split(",") if fd), frontend=frontend_index)
    main = _serve(repository, host, http_port, grpc_port, metrics_port, device, policy, max_body_bytes, shared_memory,
                  worker, link, inline_us)
    (uvloop.run if uvloop is not None and loop != "asyncio" else asyncio.run)(main)


def _cuda_opener(device: str):
    """What opens clients' CUDA shared memory regions: on a GPU server cuda_ipc.open_handle, else None (off)."""
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        return None
    from kiln.serve.cuda_ipc import open_handle

    return open_handle


def _set_host_threads(count: int, device: str) -> None:
    """torch's intra-op threads: `count`, or with 0 one when the engines run on a GPU (batch copies only: a team of
    one thread per core waits for its slowest member when clients and front ends share the cores)."""
    import torch

    if count == 0 and device != "cpu" and torch.cuda.is_available():
        count = 1
    if count:
        torch.set_num_threads(count)


def _listen(host: str, port: int):
    """A bound, listening socket (port 0: a free one). Made with proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on
    such sockets' connections, and without it a JSON response (headers and body written apart) waits ~40 ms for the
    client's delayed ACK (Nagle)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


async def _maybe_await(value):
    import inspect

    return await value if inspect.isawaitable(value) else value


def _publish_statistics(repo, shared):
    """The task publishing this worker's statistics for the others (`SharedStatistics.run`); None without `shared`."""
    import asyncio

    from kiln.serve.metrics import statistics_of

    return None if shared is None else asyncio.create_task(shared.run(lambda: statistics_of(repo.models())))


async def _final_statistics(task, repo, shared) -> None:
    """Stop the publishing `task` and publish once more: the requests drained at shutdown count too."""
    import asyncio
    import contextlib

    from kiln.serve.metrics import statistics_of

    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    with contextlib.suppress(OSError):
        shared.publish(statistics_of(repo.models()))


@dataclass(frozen=True)
class Worker:
    """What one process of `kiln serve --workers N` is told: its index and the listening sockets (HTTP, metrics)
    its parent shares with it."""

    index: int
    fds: dict[str, int | None]


def _free_port(host: str) -> int:
    """A port free on `host` now (for the workers' shared gRPC port when --grpc-port is 0)."""
    sock = _listen(host, 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def _shared(flag: str, sock) -> tuple[list[str], list[int]]:
    """A child's arguments and inherited fds for a listening socket its parent shares (`--FLAG-port -1`: none)."""
    if sock is None:
        return [f"--{flag}-port", "-1"], []
    return [f"--{flag}-port", str(sock.getsockname()[1]), f"--{flag}-fd", str(sock.fileno())], [sock.fileno()]


def _serve_workers(root: Path, host: str, http_port: int, grpc_port: int, metrics_port: int, count: int,
                   argv: list[str]) -> int:
    """Start `count` worker processes of `kiln serve` sharing one listening HTTP socket and one gRPC port
    (SO_REUSEPORT); pass SIGINT / SIGTERM on and wait (`_supervise`)."""
    http = _listen(host, http_port) if http_port >= 0 else None
    metrics = _listen(host, metrics_port) if metrics_port >= 0 else None
    grpc = grpc_port if grpc_port != 0 else _free_port(host)
    (http_args, http_fds), (metrics_args, metrics_fds) = _shared("http", http), _shared("metrics", metrics)
    cmds = [([*http_args, "--grpc-port", str(grpc), *metrics_args, "--worker-index", str(i)], [*http_fds, *metrics_fds])
            for i in range(count)]
    try:
        return _supervise(root, host, cmds, argv, "workers")
    finally:
        for sock in (http, metrics):
            if sock is not None:
                sock.close()


def _serve_frontends(root: Path, host: str, http_port: int, grpc_port: int, metrics_port: int, count: int,
                     argv: list[str]) -> int:
    """One engine process (the models, their batchers; /metrics) and `count` front-end processes sharing the HTTP
    socket and the gRPC port, linked by a Unix socket and one shared memory file per front end (`kiln.serve.link`)."""
    import os
    import shutil
    import tempfile

    from kiln.serve.link import DEFAULT_SLOT_BYTES, DEFAULT_SLOTS, memfd

    http = _listen(host, http_port) if http_port >= 0 else None
    metrics = _listen(host, metrics_port) if metrics_port >= 0 else None
    grpc = grpc_port if grpc_port != 0 else _free_port(host)
    folder = tempfile.mkdtemp(prefix="kiln-link-")
    if len(folder) > 80:  # a Unix socket's path has at most 107 bytes
        shutil.rmtree(folder)
        folder = tempfile.mkdtemp(prefix="kiln-link-", dir="/tmp")
    path = os.path.join(folder, "engine.sock")
    shm = [memfd(f"kiln-link-{i}", DEFAULT_SLOTS * DEFAULT_SLOT_BYTES) for i in range(count)]
    link = ["--link", path]
    (metrics_args, metrics_fds), (http_args, http_fds) = _shared("metrics", metrics), _shared("http", http)
    engine = (["--http-port", "-1", "--grpc-port", "-1", "--worker-index", "0", *link, "--link-fds",
               ",".join(map(str, shm)), *metrics_args], [*shm, *metrics_fds])
    fronts = [([*http_args, "--grpc-port", str(grpc), "--metrics-port", "-1", "--worker-index", str(i), *link,
                "--link-fds", str(fd), "--frontend-index", str(i)], [fd, *http_fds]) for i, fd in enumerate(shm)]
    try:
        return _supervise(root, host, [engine, *fronts], argv, "processes (an engine and front ends)")
    finally:
        for sock in (http, metrics):
            if sock is not None:
                sock.close()
        for fd in shm:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


STRAGGLER_GRACE_S = 10.0  # how long the rest of a broken server may take to stop before it is killed


def _supervise(root: Path, host: str, children: list[tuple[list[str], list[int]]], argv: list[str], what: str) -> int:
    """Run one `kiln serve` child per (arguments, inherited fds) with `argv` added; pass SIGINT / SIGTERM on and wait.
    If a child stops, the others are stopped; returns the first non-zero exit code (128 + N for a child killed by
    signal N, as a shell says)."""
    import os
    import shutil
    import signal
    import subprocess
    import tempfile
    import time

    from kiln.serve.logs import event
    from kiln.serve.metrics import MULTIPROCESS_ENV

    counts = tempfile.mkdtemp(prefix="kiln-serve-metrics-")  # the children's metric and statistics files
    env = os.environ | {MULTIPROCESS_ENV: counts}
    procs = [subprocess.Popen([sys.executable, "-m", "kiln", "serve", str(root), "--host", host, *args, *argv],
                              pass_fds=fds, env=env) for args, fds in children]
    event(f"{len(procs)} {what} started (pids {', '.join(str(p.pid) for p in procs)})", event="workers",
          count=len(procs))
    stopping = []

    def forward(sig, _frame):
        stopping.append(sig)
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.2)
        if not stopping:  # one child stopped on its own: the server is not whole, stop the others
            event("a worker stopped: stopping the others", event="worker_stopped")
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + STRAGGLER_GRACE_S
            for p in procs:  # a front end whose engine is gone may hang in its drain: it gets a bounded grace
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    event(f"pid {p.pid} did not stop in {STRAGGLER_GRACE_S:.0f} s: killed", event="worker_killed")
                    p.kill()
        codes = [p.wait() for p in procs]
    finally:
        shutil.rmtree(counts, ignore_errors=True)
    return next((c if c > 0 else 128 - c for c in codes if c), 0)  # a child killed by signal N: 128 + N


async def _serve(root: Path, host: str, http_port: int, grpc_port: int, metrics_port: int, device: str, policy: str,
                 max_body_bytes: int, shared_memory: bool = False, worker: Worker | None = None, link=None,
                 inline_us: int = INLINE_US) -> None:
    """The server's one process (or one worker, or with `link` the engine or a front end of --frontends)."""
    import asyncio
    import contextlib
    import logging
    import signal
    import socket

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import Response

    from kiln.serve.http import create_app
    from kiln.serve.logs import event
    from kiln.serve.metrics import Metrics, SharedStatistics
    from kiln.serve.repository import ModelRepository
    from kiln.serve.shared_memory import SharedMemoryRegistry

    class Server(uvicorn.Server):
        def capture_signals(self):  # the loop below owns SIGINT / SIGTERM
            return contextlib.nullcontext()

    who = "" if worker is None else f"worker {worker.index}: "
    if link is not None:
        who = "engine: " if link.frontend is None else f"front end {link.frontend}: "
    metrics = Metrics()
    regions = SharedMemoryRegistry(cuda=_cuda_opener(device)) if shared_memory else None  # for HTTP and gRPC alike
    shared_stats = SharedStatistics.from_env(None if worker is None or link else worker.index)  # None: one process
    if link is not None and link.frontend is not None:
        from kiln.serve.linked import LinkedRegions, LinkedRepository

        repo = LinkedRepository(root, link, metrics=metrics)
        if regions is not None:  # the engine process keeps the regions, for every front end
            regions = LinkedRegions(repo, cuda="cuda_shared_memory" in regions.extensions)
    else:
        repo = ModelRepository(root, device=device, policy=policy, metrics=metrics, inline_us=inline_us,
                               control=None if worker is None else "this server runs several workers (--workers), "
                                                                   "each with its own models; serve with --workers 1 "
                                                                   "to load and unload")
    link_server = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    servers, sockets, grpc_server, publishing, watching = [], [], None, None, None
    try:
        if not await _started(repo, stop):
            return  # stopped before the models were up (a front end still waiting for a killed engine process)
        publishing = _publish_statistics(repo, shared_stats)
        watching = asyncio.create_task(metrics.watch_loop(who.removesuffix(": ") or "server"))
        if link is not None and link.frontend is None:
            from kiln.serve.link_server import LinkServer

            link_server = LinkServer(repo, link, regions)
            await link_server.start()
            event(f"{who}front ends link on {link.path}", event="listening", protocol="link", path=link.path)
        for m in repo.index() if link is None or link.frontend is None else []:  # the engine says it once
            state = m.get("state")
            reason = f" ({m['reason']})" if m.get("reason") and state != "READY" else ""
            event(f"{who}model {m.get('name')} version {m.get('version')}: {state}{reason}", event="model_state",
                  model=m.get("name"), version=m.get("version"), state=state, reason=m.get("reason") or "")
        apps = []
        if http_port >= 0:
            apps.append(("HTTP", create_app(repo, max_body_bytes=max_body_bytes, metrics=metrics,
                                               shared_memory=regions, shared_stats=shared_stats), http_port))
        if metrics_port >= 0:
            metrics_app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
            metrics_app.add_api_route("/metrics", lambda: Response(metrics.render(), media_type=metrics.content_type),
                                      methods=["GET"])
            apps.append(("metrics", metrics_app, metrics_port))
        for what, app, port in apps:
            fd = worker.fds.get(what) if worker is not None else None
            sock = socket.socket(fileno=fd) if fd is not None else _listen(host, port)
            sockets.append(sock)
            config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                    timeout_graceful_shutdown=GRACE_S)
            servers.append(Server(config))
            event(f"{who}{what} on http://{_url(host, sock.getsockname()[1])}", event="listening", protocol=what,
                  host=host, port=sock.getsockname()[1])
        if grpc_port >= 0:
            try:
                from kiln.serve.grpc_server import create_grpc_server
            except ImportError as e:
                event(f"gRPC off: {e}", logging.WARNING, event="grpc_off", reason=str(e))
            else:
                grpc_server = create_grpc_server(repo, host, grpc_port, max_message_bytes=max_body_bytes,
                                                 shared_memory=regions, reuse_port=worker is not None,
                                                 shared_stats=shared_stats)
                await grpc_server.start()
                event(f"{who}gRPC on {_url(host, grpc_server.kiln_port)}", event="listening", protocol="gRPC",
                      host=host, port=grpc_server.kiln_port)
        if regions is not None:
            kinds = " and ".join(k.removesuffix("_shared_memory") for k in regions.extensions)
            event(f"shared memory ({kinds}): on", event="shared_memory", kinds=regions.extensions)
        tasks = [asyncio.create_task(s.serve(sockets=[sock])) for s, sock in zip(servers, sockets)]
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
        event("shutting down: finishing the requests in flight", event="shutting_down")
        for s in servers:
            s.should_exit = True
        stopping.cancel()
        if grpc_server is not None:
            await grpc_server.stop(GRACE_S)
            grpc_server = None
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t  # re-raises a server's own failure
    finally:
        if watching is not None:
            watching.cancel()
        if grpc_server is not None:
            await grpc_server.stop(0)
        for sock in sockets:
            sock.close()
        await _maybe_await(repo.close())
        if link_server is not None:
            await link_server.close()
        await _final_statistics(publishing, repo, shared_stats)
        if regions is not None:
            regions.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    event(f"{who}stopped", event="stopped")


async def _started(repo, stop) -> bool:
    """Start `repo` unless the server is told to stop first (SIGTERM while a front end waits for its engine process,
    which may have been killed meanwhile); whether it started."""
    import asyncio
    import contextlib

    starting = asyncio.ensure_future(_maybe_await(repo.start(load_all=True)))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        stopping.cancel()
        starting.result()  # a failure to start is raised here
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    return False


def _parse_autoscale(spec: str) -> tuple[int, int]:
    """`"1:4"` → (1, 4); ConfigError for anything but MIN:MAX with 0 <= MIN <= MAX and MAX >= 1."""
    from kiln.errors import ConfigError

    lo, sep, hi = spec.partition(":")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise ConfigError(f"--autoscale {spec!r} is not MIN:MAX; write e.g. --autoscale 1:4")
    a, b = int(lo), int(hi)
    if b < 1 or a > b:
        raise ConfigError(f"--autoscale {spec!r}: need MIN <= MAX and MAX >= 1")
    return a, b


def _serve_ray(root: Path, host: str, http_port: int, device: str, policy: str, max_body_bytes: int,
               replicas: int | None, autoscale: str | None, address: str | None,
               gpus_per_replica: float | None = None) -> None:
    """`kiln serve --ray`: deploy on Ray Serve, block until SIGINT / SIGTERM, then shut Ray Serve down."""
    import signal
    import threading

    from kiln.errors import ConfigError
    from kiln.serve import ray_app
    from kiln.serve.logs import event

    if replicas is not None and autoscale is not None:
        raise ConfigError("give --replicas or --autoscale, not both")
    scale: dict = {"num_replicas": replicas}
    if autoscale is not None:
        lo, hi = _parse_autoscale(autoscale)
        scale = {"min_replicas": lo, "max_replicas": hi}
    if gpus_per_replica is not None:
        scale["num_gpus"] = gpus_per_replica
        ray_app.deployment_options("cuda", num_gpus=gpus_per_replica)  # a bad share fails before Ray starts
    ray_app.import_ray()  # the missing-install error before anything starts

    say = event  # the server's logs (text or JSON)

    stop = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in signals}
    try:
        say(f"starting Ray Serve ({f'cluster at {address}' if address else 'a local Ray cluster'})")
        serving = ray_app.start(root, host=host, port=http_port, address=address, device=device, policy=policy,
                                max_body_bytes=max_body_bytes, **scale)
        try:
            for sig in signals:  # ray.init put its own (crash-report) SIGTERM handler in place of ours
                signal.signal(sig, lambda *_: stop.set())
            for m in serving.index:
                state = m.get("state")
                reason = f" ({m['reason']})" if m.get("reason") and state != "READY" else ""
                event(f"model {m.get('name')} version {m.get('version')}: {state}{reason}", event="model_state",
                      model=m.get("name"), version=m.get("version"), state=state, reason=m.get("reason") or "")
            how = (f"autoscaling {scale['min_replicas']}..{scale['max_replicas']} replicas" if autoscale is not None
                   else f"{replicas or 1} replica{'s' if (replicas or 1) > 1 else ''}")
            say(f"Ray Serve, {how}; gRPC and --metrics-port are off under --ray")
            say(f"HTTP on http://{serving.url}")
            while not stop.wait(0.5):
                pass
            say("shutting down Ray Serve: finishing the requests in flight")
        finally:
            serving.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    say("stopped")
