"""The KServe v2 (Triton) HTTP protocol over a `ModelRepository`: health, metadata, config, infer (JSON tensors and the
binary tensor data extension, as tritonclient.http speaks them), the repository extension, statistics, system and CUDA
shared memory (when given a `SharedMemoryRegistry`) and /metrics.

Every error is `{"error": "..."}` with the `ServeError`'s HTTP status. The request parsing and response encoding are
pure functions (`parse_infer_request`, `encode_infer_response`) so they can be tested without a server.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import logging
import json
import math
import re
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from kiln.errors import InternalError, KilnError
from kiln.serve.dtypes import V2_TO_NUMPY, numpy_to_v2, to_v2
from kiln.serve.errors import BadRequest, ClientGone, ModelNotFound, ServeError, TooLarge
from kiln.serve.metrics import SharedStatistics, statistics_of
from kiln.serve.shared_memory import CUDA, SYSTEM, SharedMemoryRegistry, TensorRef, off_error, tensor_ref
from kiln.version import __version__

HEADER_LENGTH = "Inference-Header-Content-Length"
EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics"]
_BAD_NAME_PARTS = ("..", "/", "\\", "\x00")

log = logging.getLogger(__name__)
# FastAPI >= 0.165 looks up OpenTelemetry providers on every request unless told not to (older ones have no option)
_NO_TELEMETRY = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                 if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


@dataclass
class InferRequest:
    """A parsed v2 inference request."""

    inputs: dict[str, np.ndarray]
    outputs: list[tuple[str, bool]] | None  # (name, binary) in the order asked; None = every output
    binary_default: bool = False  # parameters.binary_data_output: outputs not listed come back binary
    id: str | None = None
    timeout_s: float | None = None
    parameters: dict = field(default_factory=dict)
    shm_outputs: dict[str, TensorRef] = field(default_factory=dict)  # outputs to write into shared memory


def _bad(message: str) -> BadRequest:
    return BadRequest(message)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _load_json(text: bytes, what: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _bad(f"{what} is not valid JSON: {e}") from None


def parse_infer_request(body: bytes, header_length: str | int | None, expected_inputs: dict[str, str] | None = None,
                        *, shared_memory: SharedMemoryRegistry | None = None) -> InferRequest:
    """Parse an infer request body. `header_length`: the Inference-Header-Content-Length header (None = the whole
    body is JSON); `expected_inputs`: the model's input names → v2 datatypes; `shared_memory`: the regions, if on.
    Binary tensors are read-only views of `body`."""
    binary = b""
    if header_length is not None:
        try:
            n = int(str(header_length).strip())
        except ValueError:
            raise _bad(f"{HEADER_LENGTH} must be an integer, got {str(header_length)[:40]!r}") from None
        if n < 0 or n > len(body):
            raise _bad(f"{HEADER_LENGTH} {n} is outside the request body of {len(body)} bytes")
        view = memoryview(body)  # the tensors are viewed in place, not sliced out (a copy each)
        body, binary = bytes(view[:n]), view[n:]
    request = _load_json(body, "the inference request")
    if not isinstance(request, dict):
        raise _bad("the inference request must be a JSON object")
    params = request.get("parameters") or {}
    if not isinstance(params, dict):
        raise _bad("'parameters' must be a JSON object")
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _bad("the inference request needs a non-empty 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, t in enumerate(raw_inputs):
        array, used = _parse_input(t, i, binary, offset, expected_inputs, shared_memory)
        name = t["name"]
        if name in inputs:
            raise _bad(f"input '{name}' is given more than once")
        inputs[name] = array
        offset += used
    if offset != len(binary):
        raise _bad(f"the request carries {len(binary)} bytes of binary tensor data but its inputs' binary_data_size "
                   f"add up to {offset}")
    if expected_inputs is not None:
        missing = [n for n in expected_inputs if n not in inputs]
        if missing:
            raise _bad(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise _bad("parameters.binary_data_output must be true or false")
    outputs, shm_outputs = _parse_outputs(request.get("outputs"), shared_memory)
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _bad("'id' must be a string")
    timeout_s = None
    if "timeout" in params:
        t = params["timeout"]
        if not _is_int(t) or t < 0:
            raise _bad("parameters.timeout must be a non-negative integer of microseconds")
        timeout_s = t / 1e6 if t else None
    return InferRequest(inputs, outputs, binary_default, request_id, timeout_s, params, shm_outputs)


def _parse_input(t, i: int, binary: bytes, offset: int, expected: dict[str, str] | None,
                 shared_memory: SharedMemoryRegistry | None = None) -> tuple[np.ndarray, int]:
    """(the array, binary bytes it used) of input number `i`."""
    if not isinstance(t, dict):
        raise _bad(f"inputs[{i}] must be a JSON object")
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"inputs[{i}] needs a 'name' string")
    if expected is not None and name not in expected:
        raise _bad(f"unknown input '{name}'; the model's inputs: {', '.join(expected) or '(none)'}")
    datatype = t.get("datatype")
    if not isinstance(datatype, str):
        raise _bad(f"input '{name}' needs a 'datatype' string")
    if datatype == "BYTES" or datatype not in V2_TO_NUMPY:
        raise _bad(f"input '{name}': datatype {datatype[:20]!r} is not supported; use one of "
                   f"{', '.join(d for d in V2_TO_NUMPY if d != 'BYTES')}")
    if expected is not None and expected[name] != datatype:
        raise _bad(f"input '{name}': datatype {datatype}, but the model expects {expected[name]}")
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _bad(f"input '{name}': 'shape' must be a list of non-negative integers")
    dtype = np.dtype(V2_TO_NUMPY[datatype])
    count = math.prod(shape)
    params = t.get("parameters") or {}
    if not isinstance(params, dict):
        raise _bad(f"input '{name}': 'parameters' must be a JSON object")
    ref = tensor_ref(f"input '{name}'", params, enabled=shared_memory is not None)
    if ref is not None:
        if "data" in t or "binary_data_size" in params:
            raise _bad(f"input '{name}' has both shared memory parameters and "
                       f"{'data' if 'data' in t else 'binary_data_size'}")
        return shared_memory.read(f"input '{name}'", ref, datatype, dtype, shape), 0
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in t:
            raise _bad(f"input '{name}' has both 'data' and parameters.binary_data_size")
        if not _is_int(size) or size < 0:
            raise _bad(f"input '{name}': binary_data_size must be a non-negative integer")
        if size != count * dtype.itemsize:
            raise _bad(f"input '{name}': binary_data_size {size} does not match shape {shape} of {datatype} "
                       f"({count * dtype.itemsize} bytes)")
        if offset + size > len(binary):
            raise _bad(f"input '{name}': binary_data_size {size} runs past the end of the binary data "
                       f"({len(binary) - offset} bytes left)")
        array = np.frombuffer(binary[offset:offset + size], dtype.newbyteorder("<"))  # read-only: the batcher copies
        return (array if array.dtype.isnative else array.astype(dtype)).reshape(shape), size
    data = t.get("data")
    if not isinstance(data, list):
        raise _bad(f"input '{name}' needs 'data' (a list) or parameters.binary_data_size")
    try:
        array = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise _bad(f"input '{name}': 'data' does not hold {datatype} values: {e}") from None
    if array.size != count:
        raise _bad(f"input '{name}': 'data' holds {array.size} values but shape {shape} needs {count}")
    return array.reshape(shape), 0


def _parse_outputs(raw, shared_memory: SharedMemoryRegistry | None = None
                   ) -> tuple[list[tuple[str, bool]] | None, dict[str, TensorRef]]:
    """((name, binary) of each requested output or None, the outputs to write into shared memory)."""
    shm: dict[str, TensorRef] = {}
    if raw is None:
        return None, shm
    if not isinstance(raw, list):
        raise _bad("'outputs' must be a list")
    outputs: list[tuple[str, bool]] = []
    for i, o in enumerate(raw):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise _bad(f"outputs[{i}] must be a JSON object with a 'name' string")
        params = o.get("parameters") or {}
        if not isinstance(params, dict):
            raise _bad(f"output '{o['name']}': 'parameters' must be a JSON object")
        if params.get("classification"):
            raise _bad(f"output '{o['name']}': classification is not supported")
        ref = tensor_ref(f"output '{o['name']}'", params, enabled=shared_memory is not None)
        if ref is not None:
            shared_memory.check(f"output '{o['name']}'", ref)
            shm[o["name"]] = ref
        binary = params.get("binary_data", False)
        if not isinstance(binary, bool):
            raise _bad(f"output '{o['name']}': binary_data must be true or false")
        if any(o["name"] == n for n, _ in outputs):
            raise _bad(f"output '{o['name']}' is requested more than once")
        outputs.append((o["name"], binary))
    return outputs or None, shm


def encode_infer_response(model_name: str, model_version: str, results: dict[str, np.ndarray],
                          order: list[tuple[str, bool]], request_id: str | None = None, *,
                          shm_outputs: dict[str, TensorRef] | None = None,
                          shared_memory: SharedMemoryRegistry | None = None) -> tuple[bytes, int | None]:
    """(body, JSON header length or None): the v2 response for `results`, outputs in `order` ((name, binary) pairs);
    binary outputs follow the JSON header, those of `shm_outputs` are written into shared memory and carry neither
    data nor parameters (as Triton's)."""
    header, blobs = encode_infer_parts(model_name, model_version, results, order, request_id,
                                       shm_outputs=shm_outputs, shared_memory=shared_memory)
    return (header, None) if not blobs else (header + b"".join(blobs), len(header))


def encode_infer_parts(model_name: str, model_version: str, results: dict[str, np.ndarray],
                       order: list[tuple[str, bool]], request_id: str | None = None, *,
                       shm_outputs: dict[str, TensorRef] | None = None,
                       shared_memory: SharedMemoryRegistry | None = None) -> tuple[bytes, list[bytes]]:
    """`encode_infer_response` as (JSON header, the binary outputs' bytes), sent one after the other: the outputs
    are not copied again into one body."""
    response: dict = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        response["id"] = request_id
    outputs, blobs = [], []
    for name, binary in order:
        array = np.asarray(results[name])
        entry: dict = {"name": name, "datatype": numpy_to_v2(array.dtype), "shape": list(array.shape)}
        if shm_outputs and name in shm_outputs:
            shared_memory.write(f"output '{name}'", shm_outputs[name], array)  # no parameters, as Triton answers:
            # NVIDIA's C++ client reads binary_data_size from any output that has parameters
        elif binary:
            blob = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()  # ASGI bodies are bytes
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1).tolist()
        outputs.append(entry)
    response["outputs"] = outputs
    return json.dumps(response, separators=(",", ":")).encode(), blobs


def _check_name(name: str) -> None:
    if not name or any(p in name for p in _BAD_NAME_PARTS):
        raise BadRequest(f"invalid model name {name[:80]!r}: no '..', '/', '\\' or NUL")


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


async def unless_gone(receive, work):
    """Await the coroutine `work`, cancelling it if the client disconnects first (a queued request is dropped, as
    over gRPC); ClientGone then, which no one reads. One watcher task: after the body, the ASGI server's next
    message is http.disconnect."""
    task, state = asyncio.current_task(), {"waiting": True, "gone": False}

    def disconnected(watch: asyncio.Future) -> None:
        if state["waiting"] and not watch.cancelled() and watch.exception() is None \
                and watch.result()["type"] == "http.disconnect":
            state["gone"] = True
            task.cancel()

    watch = asyncio.ensure_future(receive())
    watch.add_done_callback(disconnected)
    try:
        return await work
    except asyncio.CancelledError:
        if not state["gone"]:
            raise
        task.uncancel()
        raise ClientGone("the client disconnected before the answer") from None
    finally:
        state["waiting"] = False
        watch.cancel()


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The request body, refused with TooLarge past `max_body_bytes`: from Content-Length before reading, and by
    counting while reading (chunked bodies); a gzip / deflate Content-Encoding is inflated under the same limit."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            n = int(length)
        except ValueError:
            raise BadRequest(f"Content-Length must be an integer, got {length[:40]!r}") from None
        if n > max_body_bytes:
            raise TooLarge(f"request body of {n} bytes is over the limit of {max_body_bytes} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_body_bytes:
            raise TooLarge(f"request body is over the limit of {max_body_bytes} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadRequest(f"Content-Encoding {encoding[:20]!r} is not supported (gzip, deflate)")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_body_bytes + 1)
    except zlib.error as e:
        raise BadRequest(f"the {encoding} request body does not inflate: {e}") from None
    if len(out) > max_body_bytes or inflater.unconsumed_tail:
        raise TooLarge(f"the inflated request body is over the limit of {max_body_bytes} bytes")
    return out


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def error_response(e: Exception, method: str, path: str) -> JSONResponse:
    """A ServeError's status and message; another KilnError is the user's (400); anything else kiln's bug (500, logged
    with its traceback)."""
    if isinstance(e, ServeError):
        return _error(int(getattr(e, "http_status", 500)), str(e) or type(e).__name__)
    if isinstance(e, KilnError) and not isinstance(e, InternalError):
        return _error(400, str(e) or type(e).__name__)
    if isinstance(e, ClientDisconnect):  # gone while sending its body: no one reads this, and it is no kiln error
        return _error(400, "the client disconnected while sending the request")
    log.error("HTTP %s %s failed", method, path, exc_info=e,
              extra={"fields": {"event": "internal_error", "path": path}})
    return _error(500, f"internal error: {type(e).__name__}: {e}")


class _PartsResponse:
    """An infer answer sent as its JSON header and then each binary output (ASGI body messages with more_body), under
    one Content-Length: large outputs are not copied again into one body; small ones are joined, as each body
    message costs the server a socket write."""

    JOIN_BELOW = 64 << 10  # bytes of binary outputs joined into the header's message

    def __init__(self, header: bytes, blobs: list[bytes]):
        small = sum(len(b) for b in blobs) < self.JOIN_BELOW
        self.parts = [header + b"".join(blobs)] if small and blobs else [header, *blobs]
        headers = [(b"content-length", str(sum(len(p) for p in self.parts)).encode())]
        if blobs:
            headers += [(b"content-type", b"application/octet-stream"),
                        (HEADER_LENGTH.lower().encode(), str(len(header)).encode())]
        else:
            headers.append((b"content-type", b"application/json"))
        self.headers = headers

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})


class InferRoute:
    """The infer endpoints (`/v2/models/NAME[/versions/V]/infer`) as plain ASGI in front of the FastAPI app: the
    hot path skips FastAPI's routing and dependency solving, which cost more than kiln's own handling of a request.
    Every other path goes on to `app`."""

    PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")

    def __init__(self, app, repo, max_body_bytes: int, shared_memory: SharedMemoryRegistry | None):
        self.app, self.repo, self.max_body_bytes, self.shared_memory = app, repo, max_body_bytes, shared_memory

    async def __call__(self, scope, receive, send) -> None:
        match = self.PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is None:
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        try:
            if scope["method"] != "POST":
                response = _error(405, f"{scope['method']} is not allowed on {scope['path']}: infer takes POST")
            else:
                response = await self.infer(request, match[1], match[2])
        except (ClientGone, ClientDisconnect):
            return  # no one reads the answer
        except Exception as e:  # noqa: BLE001 - the same answers as the app's exception handlers
            response = error_response(e, scope["method"], scope["path"])
        await response(scope, receive, send)

    async def infer(self, request: Request, name: str, version: str | None) -> _PartsResponse:
        start = time.perf_counter_ns()
        _check_name(name)
        served = self.repo.get(name, version)
        body = await read_body(request, self.max_body_bytes)
        decode_start = time.perf_counter_ns()  # the body's transfer is in `success`, not in compute_input
        expected = {t.name: to_v2(t.data_type) for t in served.config.input}
        parsed = parse_infer_request(body, request.headers.get(HEADER_LENGTH), expected,
                                     shared_memory=self.shared_memory)
        known = [t.name for t in served.config.output]
        if parsed.outputs is not None:
            for out_name, _ in parsed.outputs:
                if out_name not in known:
                    raise BadRequest(f"unknown output '{out_name}'; the model's outputs: {', '.join(known)}")
            order = parsed.outputs
        else:
            order = [(n, parsed.binary_default) for n in known]
        requested = [n for n, _ in parsed.outputs] if parsed.outputs is not None else None

        def encode(results: dict[str, np.ndarray]) -> tuple[bytes, list[bytes]]:
            return encode_infer_parts(served.name, str(served.version), results, order, parsed.id,
                                      shm_outputs=parsed.shm_outputs, shared_memory=self.shared_memory)

        header, blobs = await unless_gone(request.receive, served.infer(
            parsed.inputs, requested, parsed.timeout_s, start_ns=start, decode_ns=time.perf_counter_ns() - decode_start,
            encode=encode, shm_outputs=parsed.shm_outputs))
        return _PartsResponse(header, blobs)


def create_app(repo, *, max_body_bytes: int = 64 << 20, metrics=None,
               shared_memory: SharedMemoryRegistry | None = None,
               shared_stats: SharedStatistics | None = None) -> FastAPI:
    """The KServe v2 HTTP app serving `repo` (a `ModelRepository`). `metrics`: the `Metrics` that /metrics renders
    (default: `repo.metrics`, if it has one); `shared_memory`: the system shared memory regions (None: off);
    `shared_stats`: the statistics summed over the workers of `kiln serve --workers N` (None: this process's)."""
    if max_body_bytes <= 0:
        raise ValueError("max_body_bytes must be positive")
    app = FastAPI(title="kiln", version=__version__, docs_url=None, redoc_url=None, openapi_url=None,
                  **_NO_TELEMETRY)
    app.state.repo = repo
    app.add_middleware(InferRoute, repo=repo, max_body_bytes=max_body_bytes, shared_memory=shared_memory)
    extensions = EXTENSIONS + (shared_memory.extensions if shared_memory is not None else [])

    @app.exception_handler(ServeError)  # handled here, not by the catch-all (Starlette re-raises what that answers)
    async def _serve_error(request: Request, e: ServeError):
        return error_response(e, request.method, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def _other_error(request: Request, e: Exception):
        return error_response(e, request.method, request.url.path)

    def model(name: str, version: str | None):
        _check_name(name)
        return repo.get(name, version)

    # health and metadata
    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready():
        return Response(status_code=200 if repo.ready() else 503)

    @app.get("/v2")
    async def server_metadata():
        return {"name": "kiln", "version": __version__, "extensions": extensions}

    async def model_ready(name: str, version: str | None = None):
        model(name, version)  # ModelNotFound (404) / ModelNotReady (400) otherwise
        return Response(status_code=200)

    async def model_metadata(name: str, version: str | None = None):
        return model(name, version).metadata()

    async def model_config(name: str, version: str | None = None):
        return model(name, version).config.to_json()

    async def model_stats(name: str, version: str | None = None):  # no version: every loaded one, as Triton
        _check_name(name)
        return {"model_stats": statistics_of(repo.models(name, version), shared_stats)}

    # statistics of every loaded model, registered before /v2/models/{name}, which would take "stats" as a name
    async def all_stats():  # every loaded version of every model; one not loaded has no statistics
        return {"model_stats": statistics_of(repo.models(), shared_stats)}

    app.add_api_route("/v2/models/stats", all_stats, methods=["GET"])
    for suffix, fn in (("/ready", model_ready), ("", model_metadata), ("/config", model_config),
                       ("/stats", model_stats)):
        app.add_api_route(f"/v2/models/{{name}}{suffix}", fn, methods=["GET"])
        app.add_api_route(f"/v2/models/{{name}}/versions/{{version}}{suffix}", fn, methods=["GET"])

    # the repository extension
    async def _json_body(request: Request) -> dict:
        body = await read_body(request, max_body_bytes)
        if not body.strip():
            return {}
        data = _load_json(body, "the request")
        if not isinstance(data, dict):
            raise BadRequest("the request must be a JSON object")
        return data

    @app.post("/v2/repository/index")
    async def repository_index(request: Request):
        data = await _json_body(request)
        index = list(repo.index())
        if data.get("ready") is True:
            index = [m for m in index if m.get("state") == "READY"]
        return JSONResponse(index)

    @app.post("/v2/repository/models/{name}/load")
    async def load(request: Request, name: str):
        _check_name(name)
        data = await _json_body(request)
        params = data.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest("'parameters' must be a JSON object")
        if "config" in params or any(k.startswith("file:") for k in params):
            raise BadRequest("loading with a config or files override is not supported; edit the repository")
        if name not in repo.names():
            raise ModelNotFound(f"no model '{name}' in the repository")
        repo.check_control()
        await _maybe_await(await asyncio.to_thread(repo.load, name))  # a build must not stall serving
        return Response(status_code=200)

    @app.post("/v2/repository/models/{name}/unload")
    async def unload(request: Request, name: str):
        _check_name(name)
        await _json_body(request)
        repo.check_control()
        await _maybe_await(repo.unload(name))
        return Response(status_code=200)

    # the system and CUDA shared memory extensions
    def regions() -> SharedMemoryRegistry:
        if shared_memory is None:
            raise off_error()
        return shared_memory

    @app.post("/v2/systemsharedmemory/region/{name}/register")
    async def shm_register(request: Request, name: str):
        registry, data = regions(), await _json_body(request)
        await _maybe_await(registry.register(name, data.get("key"), data.get("offset", 0), data.get("byte_size")))
        return Response(status_code=200)

    @app.post("/v2/cudasharedmemory/region/{name}/register")
    async def cuda_register(request: Request, name: str):
        registry, data = regions(), await _json_body(request)
        raw = data.get("raw_handle")
        if not isinstance(raw, dict) or not isinstance(raw.get("b64"), str):
            raise BadRequest(f"CUDA shared memory region {name!r}: raw_handle must be {{\"b64\": base64 of the CUDA "
                             "IPC handle}")
        try:  # perf_analyzer's encoder breaks lines every 72 characters and ends with one, as libb64 does
            handle = base64.b64decode("".join(raw["b64"].split()), validate=True)
        except ValueError:
            raise BadRequest(f"CUDA shared memory region {name!r}: raw_handle.b64 is not base64") from None
        await _maybe_await(registry.register_cuda(name, handle, data.get("device_id", 0), data.get("byte_size")))
        return Response(status_code=200)

    def region_routes(kind: str, path: str) -> None:
        async def status(name: str = ""):
            return JSONResponse(await _maybe_await(regions().status(name, kind)))

        async def unregister(request: Request, name: str = ""):
            registry = regions()
            await _json_body(request)
            await _maybe_await(registry.unregister(name, kind))
            return Response(status_code=200)

        for prefix in (f"/v2/{path}", f"/v2/{path}/region/{{name}}"):
            app.add_api_route(f"{prefix}/status", status, methods=["GET"])
            app.add_api_route(f"{prefix}/unregister", unregister, methods=["POST"])

    region_routes(SYSTEM, "systemsharedmemory")
    region_routes(CUDA, "cudasharedmemory")

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST

        m = metrics if metrics is not None else getattr(repo, "metrics", None)
        return Response(m.render() if m is not None else b"", media_type=CONTENT_TYPE_LATEST)

    return app

