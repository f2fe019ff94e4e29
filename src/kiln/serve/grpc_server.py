"""The KServe v2 / Triton gRPC protocol over a `ModelRepository`, on grpc.aio.

The messages and the service are the protocol's published protobuf definitions as tritonclient ships them
(`tritonclient.grpc.service_pb2`, `model_config_pb2`), so `tritonclient.grpc.InferenceServerClient` (and any other
Triton gRPC client) talks to kiln unchanged. grpc and tritonclient are imported here only: nothing else in kiln
imports this module at import time.

Errors: a `ServeError` aborts the call with its `grpc_code` and message; anything else is kiln's bug (INTERNAL, "bug
in kiln", logged with its traceback). System and CUDA shared memory are served when given a `SharedMemoryRegistry`;
streaming, tracing and log settings are UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from kiln.serve.dtypes import V2_TO_NUMPY, numpy_to_v2
from kiln.serve.errors import BadRequest, ModelNotFound, ModelNotReady, ServeError
from kiln.serve.metrics import SharedStatistics, statistics_of
from kiln.serve.shared_memory import PARAMS as SHM_PARAMS
from kiln.serve.shared_memory import CUDA, SYSTEM, SharedMemoryRegistry, TensorRef, off_error, tensor_ref
from kiln.version import __version__

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # the HTTP server's default body limit
EXTENSIONS = ["model_repository", "model_configuration", "statistics"]

# InferTensorContents' repeated field for each v2 datatype (FP16 / BF16 have none: raw_input_contents only)
_CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                   "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                   "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                   "FP64": "fp64_contents"}
# the wire dtype of each numeric v2 datatype (raw contents are little-endian)
_LITTLE_ENDIAN = {name: dtype.newbyteorder("<") for name, dtype in V2_TO_NUMPY.items() if name != "BYTES"}


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


def _rpc(method):
    """Run one RPC: a ServeError aborts with its code and message, anything else with INTERNAL ("bug in kiln")."""

    @functools.wraps(method)
    async def call(self, request, context):
        try:
            return await method(self, request, context)
        except ServeError as e:
            code, message = grpc.StatusCode[e.grpc_code], str(e)
        except Exception as e:  # noqa: BLE001 - a kiln bug must not leak a traceback to the client
            log.exception("gRPC %s failed", method.__name__)
            code, message = grpc.StatusCode.INTERNAL, f"bug in kiln: {type(e).__name__} in {method.__name__}"
        await context.abort(code, message)

    return call


def _unimplemented(name: str):
    async def call(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"kiln's gRPC server does not implement {name}")

    call.__name__ = name
    return call


def _message(cls, data: dict):
    """`data` (JSON with the protocol's field names) as a `cls` message; fields the message lacks are skipped."""
    try:
        return json_format.ParseDict(data, cls(), ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise RuntimeError(f"cannot express {data!r} as {cls.__name__}: {e}") from e


def _shm_ref(what: str, parameters, shared_memory: SharedMemoryRegistry | None) -> TensorRef | None:
    """The shared memory parameters of a tensor's InferParameter map (None: it has none)."""
    if not parameters:  # the usual case: no parameters at all, nothing to look up
        return None
    values = {}
    for key in SHM_PARAMS:
        if key in parameters:
            choice = parameters[key].WhichOneof("parameter_choice")
            values[key] = getattr(parameters[key], choice) if choice else None
    return tensor_ref(what, values, enabled=shared_memory is not None)


def _decode_input(tensor, raw: bytes | None, shared_memory: SharedMemoryRegistry | None = None) -> np.ndarray:
    """One ModelInferRequest input as an array (raw little-endian bytes, its typed InferTensorContents, or read from
    a shared memory region). Raw bytes are viewed in place, read-only: the batcher copies what it hands on as is."""
    name, datatype = tensor.name, tensor.datatype
    if datatype == "BYTES":
        raise BadRequest(f"input '{name}': BYTES tensors are not supported (engine inputs are numeric)")
    dtype = _LITTLE_ENDIAN.get(datatype)
    if dtype is None:
        raise BadRequest(f"input '{name}': unknown datatype '{datatype}'")
    shape = list(tensor.shape)
    if any(d < 0 for d in shape):
        raise BadRequest(f"input '{name}': shape {shape} has a negative dimension")
    count = math.prod(shape)
    ref = _shm_ref(f"input '{name}'", tensor.parameters, shared_memory)
    if ref is not None:
        if tensor.HasField("contents"):
            raise BadRequest(f"input '{name}': data given both in shared memory and in contents")
        return shared_memory.read(f"input '{name}'", ref, datatype, dtype, shape)
    if raw is not None:
        if tensor.HasField("contents"):
            raise BadRequest(f"input '{name}': data given both in raw_input_contents and in contents")
        if len(raw) != count * dtype.itemsize:
            raise BadRequest(f"input '{name}': {len(raw)} bytes of data, but shape {shape} of {datatype} needs "
                             f"{count * dtype.itemsize}")
        array = np.frombuffer(raw, dtype=dtype)
        return (array if dtype.isnative else array.astype(dtype.newbyteorder("="))).reshape(shape)
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadRequest(f"input '{name}': {datatype} data must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise BadRequest(f"input '{name}': {len(values)} values in contents.{field}, but shape {shape} needs "
                         f"{count}")
    array = np.asarray(values)
    if dtype.kind in "iu" and array.size and not np.all(array.astype(dtype) == array):
        raise BadRequest(f"input '{name}': values out of range for {datatype}")
    return array.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def decode_inputs(request, shared_memory: SharedMemoryRegistry | None = None) -> dict[str, np.ndarray]:
    """The inputs of a ModelInferRequest by name; raw_input_contents holds those not in shared memory, in order."""
    raw = request.raw_input_contents
    in_shm = [bool(t.parameters) and any(p in t.parameters for p in SHM_PARAMS) for t in request.inputs]
    if raw and len(raw) != in_shm.count(False):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for {in_shm.count(False)} inputs not in shared "
                         "memory: send every such input's data raw, or none")
    inputs, raws = {}, iter(raw)
    for tensor, shm in zip(request.inputs, in_shm):
        if tensor.name in inputs:
            raise BadRequest(f"input '{tensor.name}' is given twice")
        inputs[tensor.name] = _decode_input(tensor, next(raws) if raw and not shm else None, shared_memory)
    return inputs


def encode_response(model, request_id: str, requested: list[str] | None, outputs: dict[str, np.ndarray], *,
                    shm_outputs: dict[str, TensorRef] | None = None, shared_memory: SharedMemoryRegistry | None = None):
    """The ModelInferResponse carrying `outputs` (in `requested` order, else theirs) as raw little-endian bytes; those
    of `shm_outputs` are written into shared memory instead (an empty raw entry and no parameters each, as Triton)."""
    response = service_pb2.ModelInferResponse(model_name=model.name, model_version=str(model.version), id=request_id)
    for name in requested or list(outputs):
        array = np.asarray(outputs[name])
        response.outputs.add(name=name, datatype=numpy_to_v2(array.dtype), shape=list(array.shape))
        ref = shm_outputs.get(name) if shm_outputs else None
        if ref is None:
            response.raw_output_contents.append(np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes())
            continue
        shared_memory.write(f"output '{name}'", ref, array)
        response.raw_output_contents.append(b"")
    return response


def _timeout_s(request, context) -> float | None:
    """The sooner of the request's "timeout" parameter (microseconds, as Triton reads it) and the call's deadline."""
    limits = []
    if "timeout" in request.parameters:
        param = request.parameters["timeout"]
        us = param.int64_param if param.WhichOneof("parameter_choice") == "int64_param" else param.uint64_param
        if us > 0:
            limits.append(us / 1e6)
    remaining = context.time_remaining()
    if remaining is not None:
        limits.append(max(remaining, 0.0))
    return min(limits) if limits else None


class KilnInferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """GRPCInferenceService over a ModelRepository."""

    def __init__(self, repo, shared_memory: SharedMemoryRegistry | None = None,
                 shared_stats: SharedStatistics | None = None):
        self.repo, self.shared_memory, self.shared_stats = repo, shared_memory, shared_stats
        self.extensions = EXTENSIONS + (shared_memory.extensions if shared_memory is not None else [])

    def _get(self, name: str, version: str = ""):
        if not name:
            raise BadRequest("no model name given")
        return self.repo.get(name, version or None)

    @_rpc
    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=bool(self.repo.ready()))

    @_rpc
    async def ModelReady(self, request, context):
        try:
            self._get(request.name, request.version)
        except (ModelNotFound, ModelNotReady):
            return service_pb2.ModelReadyResponse(ready=False)
        return service_pb2.ModelReadyResponse(ready=True)

    @_rpc
    async def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(name="kiln", version=__version__, extensions=self.extensions)

    @_rpc
    async def ModelMetadata(self, request, context):
        return _message(service_pb2.ModelMetadataResponse, self._get(request.name, request.version).metadata())

    @_rpc
    async def ModelConfig(self, request, context):
        config = _message(model_config_pb2.ModelConfig, self._get(request.name, request.version).config.to_json())
        return service_pb2.ModelConfigResponse(config=config)

    @_rpc
    async def ModelInfer(self, request, context):
        start = time.perf_counter_ns()
        model = self._get(request.model_name, request.model_version)
        inputs = decode_inputs(request, self.shared_memory)
        requested = [o.name for o in request.outputs] or None
        if requested is not None and len(set(requested)) != len(requested):
            raise BadRequest(f"an output is requested twice: {requested}")
        shm_outputs = {}
        for o in request.outputs:
            ref = _shm_ref(f"output '{o.name}'", o.parameters, self.shared_memory)
            if ref is not None:
                self.shared_memory.check(f"output '{o.name}'", ref)
                shm_outputs[o.name] = ref
        timeout_s = _timeout_s(request, context)
        encode = functools.partial(encode_response, model, request.id, requested, shm_outputs=shm_outputs,
                                   shared_memory=self.shared_memory)
        return await model.infer(inputs, requested, timeout_s=timeout_s, start_ns=start,
                                 decode_ns=time.perf_counter_ns() - start, encode=encode, shm_outputs=shm_outputs)

    @_rpc
    async def ModelStatistics(self, request, context):
        # a name without a version: every loaded version of it; no name: every loaded version of every model
        models = self.repo.models(request.name or None, request.version or None)
        stats = [_message(service_pb2.ModelStatistics, s) for s in statistics_of(models, self.shared_stats)]
        return service_pb2.ModelStatisticsResponse(model_stats=stats)

    @_rpc
    async def RepositoryIndex(self, request, context):
        response = service_pb2.RepositoryIndexResponse()
        for entry in await _maybe_await(self.repo.index()):
            if request.ready and entry.get("state") != "READY":
                continue
            response.models.add(name=entry["name"], version=str(entry.get("version") or ""),
                                state=entry.get("state") or "", reason=entry.get("reason") or "")
        return response

    @_rpc
    async def RepositoryModelLoad(self, request, context):
        if request.parameters:
            raise BadRequest(f"load parameters are not supported: {sorted(request.parameters)}")
        if not request.model_name:
            raise BadRequest("no model name given")
        self.repo.check_control()
        # in a worker thread: loading may build an engine from ONNX (minutes), and the loop must keep serving
        await _maybe_await(await asyncio.to_thread(self.repo.load, request.model_name))
        return service_pb2.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request, context):
        if not request.model_name:
            raise BadRequest("no model name given")
        self.repo.check_control()
        await _maybe_await(self.repo.unload(request.model_name))
        return service_pb2.RepositoryModelUnloadResponse()

    def _regions(self) -> SharedMemoryRegistry:
        if self.shared_memory is None:
            raise off_error()
        return self.shared_memory

    @_rpc
    async def SystemSharedMemoryStatus(self, request, context):
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for region in await _maybe_await(self._regions().status(request.name, SYSTEM)):
            response.regions[region["name"]].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_rpc
    async def SystemSharedMemoryRegister(self, request, context):
        await _maybe_await(self._regions().register(request.name, request.key, request.offset, request.byte_size))
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request, context):
        await _maybe_await(self._regions().unregister(request.name, SYSTEM))
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    @_rpc
    async def CudaSharedMemoryStatus(self, request, context):
        response = service_pb2.CudaSharedMemoryStatusResponse()
        for region in await _maybe_await(self._regions().status(request.name, CUDA)):
            response.regions[region["name"]].CopyFrom(
                service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_rpc
    async def CudaSharedMemoryRegister(self, request, context):
        await _maybe_await(self._regions().register_cuda(request.name, request.raw_handle, request.device_id,
                                                         request.byte_size))
        return service_pb2.CudaSharedMemoryRegisterResponse()

    @_rpc
    async def CudaSharedMemoryUnregister(self, request, context):
        await _maybe_await(self._regions().unregister(request.name, CUDA))
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    ModelStreamInfer = _unimplemented("ModelStreamInfer")
    TraceSetting = _unimplemented("TraceSetting")
    LogSettings = _unimplemented("LogSettings")


def create_grpc_server(repo, host: str = "127.0.0.1", port: int = 8001, *,
                       max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                       shared_memory: SharedMemoryRegistry | None = None, reuse_port: bool = False,
                       shared_stats: SharedStatistics | None = None) -> grpc.aio.Server:
    """A grpc.aio server for `repo` bound to host:port (port 0: a free one), not yet started: `await
    server.start()`, and `await server.stop(grace)` before `repo.close()`. The bound port is `server.kiln_port`.
    Messages above `max_message_bytes` are refused (RESOURCE_EXHAUSTED) both ways; `shared_memory`: the system shared
    memory regions (None: off); `reuse_port`: share the port with the other workers of `kiln serve --workers`;
    `shared_stats`: the statistics summed over those workers (None: this process's).
    Call it with the event loop the repository serves on running."""
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.so_reuseport", int(reuse_port))]  # off: a port already taken fails instead of sharing
    server = grpc.aio.server(options=options)
    servicer = KilnInferenceServicer(repo, shared_memory, shared_stats)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise OSError(f"gRPC cannot listen on {address}: {e}") from e
    if not bound:
        raise OSError(f"gRPC cannot listen on {address}")
    server.kiln_port = bound
    return server
