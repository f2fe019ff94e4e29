"""`kiln loadgen URL MODEL`: drive a kiln (or any KServe v2) server at a fixed concurrency with tritonclient and
report throughput, latency percentiles and errors by status; with `--shared-memory system` (or `cuda`) tensors go
through POSIX (or GPU) shared memory, Triton's extensions, instead of the socket."""

from __future__ import annotations

import ipaddress
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kiln.cli.errors import command
from kiln.cli.options import Json, Seed, Verbose, parse_shapes
from kiln.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

MAX_REQUESTS = 10**6
MAX_DURATION_S = 3600.0
MAX_CONCURRENCY = 1024
PROTOCOLS = ("http", "grpc")
SHARED_MEMORY = ("none", "system", "cuda")


@command
def loadgen(
    url: Annotated[str, typer.Argument(help="The server's host:port (HTTP or gRPC port, as --protocol says).",
                                       show_default=False)],
    model: Annotated[str, typer.Argument(help="The model to infer with.", show_default=False)],
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, max=MAX_CONCURRENCY,
                                             help="Requests in flight at all times (one client thread each).")] = 1,
    requests: Annotated[Optional[int], typer.Option("--requests", "-n", min=1, max=MAX_REQUESTS,
                                                    help="Send this many requests, then stop.")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", "-d", min=0.001, max=MAX_DURATION_S,
                                                      help="Send requests for this many seconds, then stop.")] = None,
    protocol: Annotated[str, typer.Option("--protocol", help="http or grpc.")] = "http",
    shared_memory: Annotated[str, typer.Option(
        "--shared-memory", help="none; system: each client thread passes its inputs and outputs through its own "
                                "POSIX shared memory regions; cuda: through its own regions of GPU 0's memory "
                                "(needs cuda-python). The server must run `kiln serve --shared-memory` on this "
                                "machine (on a GPU for cuda).")] = "none",
    inputs: Annotated[Optional[list[str]], typer.Option(
        "--input", "-i", help="name=file.npy: send this array as that input; repeatable. Inputs not given are "
                              "random, of the --shape or the model's shape (-1 dims as 1).")] = None,
    shape: Annotated[Optional[list[str]], typer.Option(
        "--shape", help="name:1x4: the shape of a random input (batch dim included); repeatable.")] = None,
    outputs: Annotated[Optional[list[str]], typer.Option(
        "--output", "-o", help="Ask for only this output; repeatable (default: every output).")] = None,
    model_version: Annotated[str, typer.Option("--model-version", help="The model version (empty: the latest).")]
    = "",
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, max=MAX_DURATION_S,
                                           help="Seconds one request may take before it counts as an error.")] = 60.0,
    allow_remote: Annotated[bool, typer.Option("--allow-remote",
                                               help="Allow a host that is not this machine (loopback).")] = False,
    seed: Seed = 0,
    json: Json = False,
    verbose: Verbose = False,
) -> None:
    """Send requests to MODEL at URL, CONCURRENCY at a time, for --requests N or --duration S; print throughput
    (infer/s), p50/p90/p99 latency and the errors by status. Exits 1 when no request succeeded."""
    from kiln.cli.output import key_values, print_json, stdout

    if (requests is None) == (duration is None):
        raise ConfigError("give exactly one of --requests N and --duration SECONDS")
    if protocol not in PROTOCOLS:
        raise ConfigError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if shared_memory not in SHARED_MEMORY:
        raise ConfigError(f"--shared-memory must be one of {', '.join(SHARED_MEMORY)}, got {shared_memory!r}")
    target = check_url(url, allow_remote)
    if shared_memory != "none" and not is_loopback(host_of(target)):
        raise ConfigError(f"--shared-memory {shared_memory} needs a server on this machine (a loopback address)")
    if shared_memory != "none":
        _shm_utils(shared_memory)
    feeds = model_inputs(target, model, model_version, protocol, inputs or [], parse_shapes(shape, "--shape"), seed,
                         timeout)
    report = run_load(target, model, feeds, protocol=protocol, concurrency=concurrency, requests=requests,
                      duration_s=duration, version=model_version, timeout_s=timeout, shared_memory=shared_memory,
                      outputs=outputs)
    if json:
        print_json(report)
    else:
        lat = report["latency_ms"]
        ms = (lambda v: "-" if v is None else f"{v:.2f} ms")  # noqa: E731
        via = f"{protocol}, tensors in {shared_memory} shared memory" if shared_memory != "none" else protocol
        rows = [("model", f"{model} at {target} ({via})"), ("concurrency", concurrency),
                ("requests", f"{report['requests']} ({report['succeeded']} succeeded, {report['failed']} failed)"),
                ("duration", f"{report['duration_s']:.2f} s"),
                ("throughput", f"{report['throughput_infer_per_s']:.1f} infer/s"),
                *((p, ms(lat[p])) for p in ("p50", "p90", "p99", "mean", "max")),
                *((f"errors {status}", n) for status, n in sorted(report["errors"].items()))]
        stdout().print(key_values("kiln loadgen", rows))
    if report["succeeded"] == 0:
        example = next(iter(report["error_examples"].values()), "")
        raise ConfigError(f"no request succeeded ({report['failed']} failed); e.g. {example}")


def check_url(url: str, allow_remote: bool) -> str:
    """`host:port` from URL (an http:// or grpc:// prefix dropped); ConfigError for a host that is not loopback
    unless `allow_remote`."""
    target = url
    for scheme in ("http://", "grpc://"):
        if target.lower().startswith(scheme):
            target = target[len(scheme):]
    target = target.rstrip("/")
    if "://" in target or "/" in target or not target:
        raise ConfigError(f"URL {url!r} is not host:port (e.g. 127.0.0.1:8000)")
    host = host_of(target)
    if not host:
        raise ConfigError(f"URL {url!r} is not host:port (e.g. 127.0.0.1:8000)")
    if not allow_remote and not is_loopback(host):
        raise ConfigError(f"{host} is not a loopback address (localhost, 127.0.0.1, ::1): kiln loadgen drives a "
                          "server on another machine only with --allow-remote")
    return target


def host_of(target: str) -> str:
    """The host of `host:port` (brackets of an IPv6 address dropped)."""
    if target.startswith("["):
        return target[1:target.find("]")] if "]" in target else ""
    return target.rpartition(":")[0] if ":" in target else target


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _modules(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    from tritonclient.utils import InferenceServerException

    return client, InferenceServerException


def _client(protocol: str, target: str, timeout_s: float):
    client, _ = _modules(protocol)
    if protocol == "grpc":
        return client.InferenceServerClient(target)
    return client.InferenceServerClient(target, connection_timeout=timeout_s, network_timeout=timeout_s)


def model_inputs(target: str, model: str, version: str, protocol: str, specs: list[str],
                 shapes: dict[str, tuple[int, ...]], seed: int, timeout_s: float) -> dict[str, np.ndarray]:
    """The arrays every request sends: --input files, else random ones of the --shape or the model's shape."""
    import numpy as np

    from kiln.cli.inputs import load_inputs
    from kiln.serve.dtypes import V2_TO_NUMPY

    _, error = _modules(protocol)
    client = _client(protocol, target, timeout_s)
    try:
        meta = (client.get_model_metadata(model, version, as_json=True) if protocol == "grpc"
                else client.get_model_metadata(model, version))
    except (error, OSError) as e:
        raise ConfigError(f"cannot get the metadata of model {model!r} from {target} ({protocol}): "
                          f"{_message(e)}") from None
    finally:
        client.close()
    declared = {t["name"]: (t["datatype"], [int(d) for d in t.get("shape", [])]) for t in meta.get("inputs", [])}
    files = load_inputs(specs)
    for what, names in (("--input", files), ("--shape", shapes)):
        if unknown := sorted(set(names) - set(declared)):
            raise ConfigError(f"{what} names {unknown}, but model {model!r} has inputs {sorted(declared)}")
    if both := sorted(set(files) & set(shapes)):
        raise ConfigError(f"{both} given by both --input and --shape; the file's shape is the one sent")
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (datatype, dims) in declared.items():
        dtype = V2_TO_NUMPY.get(datatype)
        if dtype is None or datatype == "BYTES":
            raise ConfigError(f"input {name!r} is {datatype}; kiln loadgen sends numeric and BOOL inputs only")
        if name in files:
            if files[name].dtype != dtype:
                raise ConfigError(f"--input {name}: the file holds {files[name].dtype}, the model takes {datatype}")
            feeds[name] = np.ascontiguousarray(files[name])
            continue
        size = shapes.get(name) or tuple(1 if d < 0 else d for d in dims)
        if dtype.kind == "f":
            value = rng.standard_normal(size)
        elif dtype.kind == "b":
            value = rng.random(size) < 0.5
        else:
            value = rng.integers(0, 4, size)
        feeds[name] = value.astype(dtype)
    return feeds


def _message(e: BaseException) -> str:
    text = e.message() if hasattr(e, "message") and callable(e.message) else str(e)
    return " ".join(str(text).split()) or type(e).__name__


def _status(e: BaseException) -> str:
    """An error's status: the HTTP code or gRPC status name the server answered, else the exception's type."""
    status = e.status() if hasattr(e, "status") and callable(e.status) else None
    return str(status).removeprefix("StatusCode.") if status else type(e).__name__


def _output_sizes(protocol: str, target: str, model: str, feeds: dict, version: str, timeout_s: float) -> dict:
    """{output name: byte size} of the model's answer to `feeds`, from one request over the socket."""
    module, _ = _modules(protocol)
    client = _client(protocol, target, timeout_s)
    try:
        result = client.infer(model, _socket_inputs(module, protocol, feeds), model_version=version)
    finally:
        client.close()
    response = result.get_response(as_json=True) if protocol == "grpc" else result.get_response()
    return {o["name"]: result.as_numpy(o["name"]).nbytes for o in response["outputs"]}


def _requested(module, protocol: str, outputs: list[str] | None) -> list | None:
    """The requested outputs of a request over the socket (binary tensors over HTTP); None: every output."""
    if not outputs:
        return None
    kw = {"binary_data": True} if protocol == "http" else {}
    return [module.InferRequestedOutput(name, **kw) for name in outputs]


def _socket_inputs(module, protocol: str, feeds: dict) -> list:
    from kiln.serve.dtypes import numpy_to_v2

    ins = []
    for name, value in feeds.items():
        inp = module.InferInput(name, list(value.shape), numpy_to_v2(value.dtype))
        if protocol == "grpc":
            inp.set_data_from_numpy(value)
        else:
            inp.set_data_from_numpy(value, binary_data=True)
        ins.append(inp)
    return ins


class _Regions:
    """One client thread's input and output shared memory regions (`memory`: system, or cuda on GPU 0): made, filled
    and registered; `close()` undoes."""

    def __init__(self, client, module, tag: str, feeds: dict, out_sizes: dict, memory: str = "system"):
        from kiln.serve.dtypes import numpy_to_v2

        self.client, self.memory, self.handles, self.names = client, memory, [], []
        self.shm = _shm_utils(memory)
        self.inputs, self.outputs = [], []
        for kind, sizes in (("in", {n: v.nbytes for n, v in feeds.items()}), ("out", out_sizes)):
            name = f"{tag}_{kind}"
            total = max(sum(sizes.values()), 1)
            if memory == "cuda":
                self.handles.append(self.shm.create_shared_memory_region(name, total, 0))
            else:
                self.handles.append(self.shm.create_shared_memory_region(name, f"/{name}", total, create_only=True))
            if kind == "in":
                self.shm.set_shared_memory_region(self.handles[-1], list(feeds.values()))
            if memory == "cuda":  # the HTTP client sends the handle in JSON: a str; gRPC decodes the base64 bytes
                raw = self.shm.get_raw_handle(self.handles[-1])
                client.register_cuda_shared_memory(name, raw if module.__name__.endswith("grpc") else raw.decode(),
                                                   0, total)
            else:
                client.register_system_shared_memory(name, f"/{name}", total)
            self.names.append(name)
            offset = 0
            for tensor, size in sizes.items():
                if kind == "in":
                    value = feeds[tensor]
                    inp = module.InferInput(tensor, list(value.shape), numpy_to_v2(value.dtype))
                    self.inputs.append(inp.set_shared_memory(name, size, offset))
                else:
                    out = module.InferRequestedOutput(tensor)
                    out.set_shared_memory(name, size, offset)
                    self.outputs.append(out)
                offset += size

    def close(self) -> None:
        unregister = (self.client.unregister_cuda_shared_memory if self.memory == "cuda"
                      else self.client.unregister_system_shared_memory)
        for name in self.names:
            try:
                unregister(name)
            except Exception:  # noqa: BLE001 (the server may be gone; the objects are removed below anyway)
                pass
        for handle in self.handles:
            self.shm.destroy_shared_memory_region(handle)


def _shm_utils(memory: str):
    """tritonclient's shared memory utilities for `memory` (system or cuda); ConfigError when this machine cannot."""
    if memory == "system":
        from tritonclient.utils import shared_memory

        return shared_memory
    try:
        import tritonclient.utils.cuda_shared_memory as cuda_shared_memory
    except (ImportError, RuntimeError) as e:  # tritonclient raises RuntimeError without cuda-python
        raise ConfigError(f"--shared-memory cuda needs cuda-python on this machine ({e})") from None
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("--shared-memory cuda needs a CUDA GPU on this machine; use --shared-memory system")
    return cuda_shared_memory


def run_load(target: str, model: str, feeds: dict[str, np.ndarray], *, protocol: str = "http", concurrency: int = 1,
             requests: int | None = None, duration_s: float | None = None, version: str = "",
             timeout_s: float = 60.0, shared_memory: str = "none", outputs: list[str] | None = None) -> dict:
    """Send `feeds` to `model` from `concurrency` threads (one client each) until `requests` were sent or
    `duration_s` passed; the report as a dict (latencies of the successful requests, in ms). `shared_memory`
    "system" / "cuda": each thread passes its tensors through its own POSIX / GPU 0 shared memory regions.
    `outputs`: ask for only these (default: every output)."""
    import numpy as np

    if shared_memory not in SHARED_MEMORY:
        raise ConfigError(f"shared_memory must be one of {', '.join(SHARED_MEMORY)}, got {shared_memory!r}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ConfigError(f"concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}")
    if requests is not None and not 1 <= requests <= MAX_REQUESTS:
        raise ConfigError(f"requests must be between 1 and {MAX_REQUESTS}, got {requests}")
    if duration_s is not None and not 0 < duration_s <= MAX_DURATION_S:
        raise ConfigError(f"duration must be in (0, {MAX_DURATION_S:.0f}] seconds, got {duration_s}")
    module, _ = _modules(protocol)
    if shared_memory != "none":
        _shm_utils(shared_memory)  # a ConfigError now, not one error per request, when the client cannot
    out_sizes = (_output_sizes(protocol, target, model, feeds, version, timeout_s) if shared_memory != "none"
                 else None)
    if out_sizes is not None and outputs:
        if unknown := [n for n in outputs if n not in out_sizes]:
            raise ConfigError(f"model {model!r} has no output {', '.join(map(repr, unknown))}; its outputs: "
                              f"{', '.join(out_sizes)}")
        out_sizes = {n: out_sizes[n] for n in outputs}
    tag = f"kiln_loadgen_{os.getpid()}_{uuid.uuid4().hex[:8]}"  # this run's region names and /dev/shm keys
    lock = threading.Lock()
    sent = [0]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    start = time.perf_counter()
    deadline = start + duration_s if duration_s is not None else None

    def take() -> bool:
        with lock:
            if deadline is not None and time.perf_counter() >= deadline:
                return False
            if sent[0] >= (requests if requests is not None else MAX_REQUESTS):
                return False
            sent[0] += 1
            return True

    def worker(i: int) -> None:
        regions = None
        try:
            client = _client(protocol, target, timeout_s)
        except Exception as e:  # noqa: BLE001 (counted: each request this thread would send is one error)
            while take():
                record(None, e)
            return
        try:
            if out_sizes is not None:
                try:
                    regions = _Regions(client, module, f"{tag}_{i}", feeds, out_sizes, shared_memory)
                except Exception as e:  # noqa: BLE001 (as above: e.g. a server without shared memory)
                    while take():
                        record(None, e)
                    return
            ins = regions.inputs if regions else _socket_inputs(module, protocol, feeds)
            outs = regions.outputs if regions else _requested(module, protocol, outputs)
            kw = {"client_timeout": timeout_s} if protocol == "grpc" else {}
            while take():
                t0 = time.perf_counter()
                try:
                    client.infer(model, ins, model_version=version, outputs=outs, **kw)
                except Exception as e:  # noqa: BLE001 (every failure is counted by its status)
                    record(None, e)
                else:
                    record(time.perf_counter() - t0, None)
        finally:
            if regions is not None:
                regions.close()
            client.close()

    def record(latency: float | None, e: BaseException | None) -> None:
        with lock:
            if e is None:
                latencies.append(latency)
            else:
                status = _status(e)
                errors[status] = errors.get(status, 0) + 1
                examples.setdefault(status, _message(e))

    threads = [threading.Thread(target=worker, args=(i,), name=f"kiln-loadgen-{i}", daemon=True)
               for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ms = np.asarray(latencies) * 1e3
    pct = (lambda q: float(np.percentile(ms, q)) if ms.size else None)  # noqa: E731
    failed = sum(errors.values())
    return {"url": target, "model": model, "protocol": protocol, "shared_memory": shared_memory,
            "concurrency": concurrency,
            "shapes": {n: list(v.shape) for n, v in feeds.items()},
            "requests": len(latencies) + failed, "succeeded": len(latencies), "failed": failed,
            "errors": dict(sorted(errors.items())), "error_examples": dict(sorted(examples.items())),
            "duration_s": elapsed, "throughput_infer_per_s": len(latencies) / elapsed if elapsed > 0 else 0.0,
            "latency_ms": {"p50": pct(50), "p90": pct(90), "p99": pct(99),
                           "mean": float(ms.mean()) if ms.size else None, "max": float(ms.max()) if ms.size else None}}

