"""`kiln.serve.ray_app`: the models of a kiln repository served by Ray Serve, for scale-out over replicas and nodes.

Each replica is a Ray actor that owns its own `ModelRepository` over the same folder (its engines, batchers and
execution contexts) and serves the very FastAPI app `kiln serve` does (`kiln.serve.http.create_app`, the KServe v2 /
Triton HTTP protocol) as a Ray Serve ingress. Ray's HTTP proxy spreads the requests over the replicas; a fixed
`num_replicas`, or autoscaling between `min_replicas` and `max_replicas` on each replica's ongoing requests (Ray's
`autoscaling_config`, `target_ongoing_requests`). On a GPU each replica takes one GPU (`num_gpus=1`: one replica per
GPU, Ray sets its CUDA_VISIBLE_DEVICES); on the CPU it takes `num_cpus`. Every response carries the answering
replica's id in the `Kiln-Replica` header.

Three ways to run it:

- `kiln serve models/ --ray --replicas 2` (or `--autoscale 1:4`, `--ray-address ADDR` for an existing cluster);
- Ray's own CLI: `serve run kiln.serve.ray_app:app_builder repository=/abs/models num_replicas=2`;
- Python::

      import ray
      from ray import serve
      from kiln.serve.ray_app import build_app

      ray.init()
      serve.start(http_options={"host": "127.0.0.1", "port": 8000})
      serve.run(build_app("models/", num_replicas=2), name="kiln", route_prefix="/")

The repository folder must exist at the same path on every node that runs a replica (a shared file system, or the
same container image). Ray is imported only when one of these functions is called: `import kiln.serve` and this
module import no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln.errors import ConfigError

REPLICA_HEADER = "Kiln-Replica"
DEFAULT_NAME = "kiln"
DEFAULT_MAX_ONGOING = 64  # requests in flight per replica: room for the dynamic batcher to merge them
DEFAULT_TARGET_ONGOING = 8.0  # autoscaling: add replicas when each has more than this many requests in flight
INSTALL_HINT = "pip install 'ray[serve]'"


def import_ray():
    """(ray, ray.serve), or ConfigError naming the install command when Ray Serve is missing."""
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise ConfigError(f"serving with Ray needs Ray Serve, which is not installed ({e}); "
                          f"install it with: {INSTALL_HINT}") from None
    return ray, serve


class _ReplicaHeader:
    """ASGI middleware: adds the `Kiln-Replica` header (the Ray Serve replica's id) to every HTTP response."""

    def __init__(self, app, replica: str):
        self.app, self.header = app, (REPLICA_HEADER.lower().encode(), replica.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def _replica_id() -> str:
    """This Ray Serve replica's unique id ("local" outside a replica)."""
    try:
        from ray import serve

        ctx = serve.get_replica_context()
    except Exception:  # not inside a replica (a plain instance in a test): no Ray context to name
        return "local"
    rid = getattr(ctx, "replica_id", None)
    return str(getattr(rid, "unique_id", None) or getattr(ctx, "replica_tag", None) or rid or "replica")


class KilnReplica:
    """One replica: a `ModelRepository` over `repository` (every model loaded at start; one that fails is
    UNAVAILABLE, as in `kiln serve`) and kiln's v2 FastAPI app over it, built by Ray Serve's late-bound ingress."""

    def __init__(self, repository: str, device: str = "cpu", policy: str = "strict", max_body_bytes: int = 64 << 20):
        from kiln.serve.repository import ModelRepository

        self.repo = ModelRepository(repository, device=device, policy=policy)
        self.repo.start(load_all=True)
        self.max_body_bytes = max_body_bytes
        self.replica_id = _replica_id()

    def __serve_build_asgi_app__(self):
        """The ASGI app of this replica (called by Ray Serve after `__init__`)."""
        from kiln.serve.http import create_app

        app = create_app(self.repo, max_body_bytes=self.max_body_bytes)
        app.add_middleware(_ReplicaHeader, replica=self.replica_id)
        return app

    def index(self) -> list[dict]:
        """The repository index (each model's version, state and reason), for a deployment handle."""
        return self.repo.index()

    def replica(self) -> str:
        """This replica's id, as the `Kiln-Replica` header says it."""
        return self.replica_id

    async def __del__(self):
        """Ray Serve's graceful shutdown: answer the requests in flight, then release the engines."""
        repo = getattr(self, "repo", None)
        if repo is not None:
            await repo.close()


def _resolve_device(device: str, ray) -> str:
    """"cpu" or "cuda": `auto` is cuda when the Ray cluster (or, before ray.init, this machine) has a GPU."""
    if device == "cpu" or device.startswith("cuda"):
        return "cpu" if device == "cpu" else "cuda"  # a replica sees its one GPU as cuda:0
    if device != "auto":
        raise ConfigError(f"device {device!r} is not auto, cpu or cuda")
    if ray.is_initialized():
        return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def deployment_options(device: str, *, num_replicas: int | None = None, min_replicas: int | None = None,
                       max_replicas: int | None = None, target_ongoing_requests: float = DEFAULT_TARGET_ONGOING,
                       max_ongoing_requests: int = DEFAULT_MAX_ONGOING, num_cpus: float = 1.0,
                       num_gpus: float = 1.0) -> dict:
    """The Ray Serve deployment options: `num_replicas` (default 1) or autoscaling between `min_replicas` and
    `max_replicas`, and `ray_actor_options` (`num_gpus` of a GPU per replica for `device` "cuda": a fraction lets
    several replicas, each its own process, share one GPU; `num_cpus` CPUs otherwise)."""
    autoscale = min_replicas is not None or max_replicas is not None
    if autoscale and num_replicas is not None:
        raise ConfigError("give either a replica count or autoscaling (min and max replicas), not both")
    if num_cpus < 0:
        raise ConfigError(f"num_cpus must be 0 or more, got {num_cpus}")
    if max_ongoing_requests < 1:
        raise ConfigError(f"max_ongoing_requests must be at least 1, got {max_ongoing_requests}")
    if not 0 < num_gpus <= 1:
        raise ConfigError(f"num_gpus per replica must be in (0, 1] (a replica runs on one GPU; 0.25: four replicas "
                          f"share one), got {num_gpus}")
    actor = {"num_cpus": num_cpus, **({"num_gpus": num_gpus} if device == "cuda" else {})}
    opts: dict = {"ray_actor_options": actor, "max_ongoing_requests": max_ongoing_requests,
                  "max_constructor_retry_count": 3}
    if autoscale:
        lo, hi = min_replicas if min_replicas is not None else 1, max_replicas
        if hi is None or lo < 0 or hi < max(lo, 1):
            raise ConfigError(f"autoscaling needs 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                              f"min {lo}, max {hi}")
        if target_ongoing_requests <= 0:
            raise ConfigError(f"target_ongoing_requests must be positive, got {target_ongoing_requests}")
        opts["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi, "initial_replicas": max(lo, 1),
                                      "target_ongoing_requests": target_ongoing_requests}
    else:
        n = 1 if num_replicas is None else num_replicas
        if n < 1:
            raise ConfigError(f"the number of replicas must be at least 1, got {n}")
        opts["num_replicas"] = n
    return opts


def build_app(repository: str | Path, *, device: str = "auto", policy: str = "strict", num_replicas: int | None = None,
              min_replicas: int | None = None, max_replicas: int | None = None,
              target_ongoing_requests: float = DEFAULT_TARGET_ONGOING, max_ongoing_requests: int = DEFAULT_MAX_ONGOING,
              num_cpus: float = 1.0, num_gpus: float = 1.0, max_body_bytes: int = 64 << 20, name: str = DEFAULT_NAME):
    """The Ray Serve application (a bound deployment, for `serve.run`) serving `repository`'s models over the v2
    HTTP routes. `device`: auto, cpu or cuda (one GPU per replica); `num_replicas`, or `min_replicas` /
    `max_replicas` / `target_ongoing_requests` for autoscaling; `max_ongoing_requests` per replica; `num_cpus` and
    `num_gpus` (on cuda) per replica; `name`: the deployment's name."""
    ray, serve = import_ray()
    root = Path(repository).expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"model repository {repository} is not a folder")
    if max_body_bytes <= 0:
        raise ConfigError(f"max_body_bytes must be positive, got {max_body_bytes}")
    resolved = _resolve_device(device, ray)
    opts = deployment_options(resolved, num_replicas=num_replicas, min_replicas=min_replicas,
                              max_replicas=max_replicas, target_ongoing_requests=target_ongoing_requests,
                              max_ongoing_requests=max_ongoing_requests, num_cpus=num_cpus, num_gpus=num_gpus)
    ingress = serve.ingress()(KilnReplica)  # late-bound: the app is built on the replica, over its repository
    deployment = serve.deployment(ingress, name=name, **opts)
    return deployment.bind(str(root), resolved, policy, max_body_bytes)


def app_builder(args: dict):
    """For Ray's CLI: `serve run kiln.serve.ray_app:app_builder repository=/abs/models [num_replicas=N]
    [min_replicas=A max_replicas=B target_ongoing_requests=T] [device=auto|cpu|cuda] [policy=strict]
    [num_cpus=C] [num_gpus=G] [max_ongoing_requests=M] [max_body_bytes=BYTES]`."""
    args = dict(args)
    if "repository" not in args:
        raise ConfigError("app_builder needs repository=FOLDER (the model repository)")
    kw: dict = {"repository": args.pop("repository")}
    casts = {"num_replicas": int, "min_replicas": int, "max_replicas": int, "max_ongoing_requests": int,
             "max_body_bytes": int, "target_ongoing_requests": float, "num_cpus": float, "num_gpus": float,
             "device": str, "policy": str, "name": str}
    for key, value in args.items():
        if key not in casts:
            raise ConfigError(f"unknown app_builder argument {key!r}; known: repository, {', '.join(casts)}")
        try:
            kw[key] = casts[key](value)
        except (TypeError, ValueError):
            what = {int: "an integer", float: "a number"}.get(casts[key], "a string")
            raise ConfigError(f"app_builder argument {key}={value!r} is not {what}") from None
    return build_app(**kw)


@dataclass
class RayServing:
    """A kiln application running on Ray Serve (from `start`): its URL, the first replica's repository index, and
    `stop()`."""

    url: str
    name: str
    index: list[dict]
    owns_cluster: bool = False  # `start` started this local Ray cluster (and so Ray Serve on it)
    owns_connection: bool = False  # `start` connected to the cluster at an address

    def stop(self) -> None:
        """Tear the application down. On the local cluster `start` started: shut Ray Serve down (replicas answer
        their requests in flight) and then the cluster. On a cluster it joined: delete only this application and
        disconnect. On a Ray the caller had initialized: delete only this application."""
        ray, serve = import_ray()
        if self.owns_cluster:
            try:
                serve.shutdown()
            finally:
                ray.shutdown()
        else:
            serve.delete(self.name)
            if self.owns_connection:
                ray.shutdown()


def start(repository: str | Path, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
          name: str = DEFAULT_NAME, **app_options) -> RayServing:
    """Deploy `build_app(repository, **app_options)` at route prefix "/", Ray Serve's HTTP proxy listening on
    `host`:`port` (port 0: a free one), and return once every replica is running. Ray: the one already initialized
    in this process, else the cluster at `address` ("auto", "host:6379"), else a new local cluster (all this
    machine's CPUs and GPUs). ConfigError when Ray Serve is missing or the deployment fails."""
    ray, serve = import_ray()
    root = Path(repository).expanduser()
    if not root.is_dir():
        raise ConfigError(f"model repository {repository} is not a folder")
    owns_cluster = owns_connection = False
    if not ray.is_initialized():
        try:
            ray.init(address=address or "local", include_dashboard=False, logging_level="warning")
        except ConnectionError as e:
            raise ConfigError(f"cannot connect to the Ray cluster at {address}: {e}") from None
        owns_cluster, owns_connection = address is None, address is not None
    try:
        if port == 0:
            port = _free_port(host)
        quiet = {"log_level": "WARNING", "enable_access_log": False}
        serve.start(http_options={"host": host, "port": port}, logging_config=quiet)
        app = build_app(root, name=name, **app_options)
        try:
            handle = serve.run(app, name=name, route_prefix="/", logging_config=quiet)
        except RuntimeError as e:
            raise ConfigError(f"the Ray Serve deployment of {repository} failed: {' '.join(str(e).split())[:2000]}") \
                from None
        index = handle.index.remote().result()
    except BaseException:
        if owns_cluster or owns_connection:
            ray.shutdown()
        raise
    return RayServing(_url(host, port), name, index, owns_cluster, owns_connection)


def _free_port(host: str) -> int:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return s.getsockname()[1]


def _url(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"

