"""Triton's CUDA shared memory extension. On the CPU: the registry, request parsing, validation and batching of
region views, through an opener that hands out host tensors in place of opened CUDA IPC handles. On a GPU: a real
`kiln serve --device cuda --shared-memory` process driven by tritonclient's CUDA shared memory utilities."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest
import torch

from kiln.serve import DynamicBatcher
from kiln.serve.errors import AlreadyExists, BadRequest, RegionNotFound, Unsupported
from kiln.serve.shared_memory import CUDA, SYSTEM, SharedMemoryRegistry, TensorRef

HANDLE = bytes(range(64))


class FakeDevice:
    """Stands in for cuda_ipc.open_handle: each known 64-byte handle names one host "allocation"."""

    def __init__(self, **allocations: int):
        self.allocations = {bytes([i]) * 64: torch.zeros(n, dtype=torch.uint8)
                            for i, n in enumerate(allocations.values())}
        self.names = dict(zip(allocations, self.allocations))
        self.opened: list[tuple[int, int]] = []

    def handle(self, name: str) -> bytes:
        return self.names[name]

    def memory(self, name: str) -> torch.Tensor:
        return self.allocations[self.names[name]]

    def __call__(self, name: str, raw: bytes, device_id: int, byte_size: int) -> torch.Tensor:
        if raw not in self.allocations:
            raise BadRequest(f"CUDA shared memory region {name!r}: the CUDA IPC handle does not open")
        memory = self.allocations[raw]
        if byte_size > memory.numel():
            raise BadRequest(f"CUDA shared memory region {name!r}: byte_size {byte_size} is larger than the allocation")
        self.opened.append((device_id, byte_size))
        return memory[:byte_size]


def _put(memory: torch.Tensor, at: int, array: np.ndarray) -> None:
    memory[at:at + array.nbytes] = torch.from_numpy(array.reshape(-1).view(np.uint8).copy())


def _get(memory: torch.Tensor, at: int, dtype, shape) -> np.ndarray:
    count = int(np.prod(shape))
    return memory[at:at + count * np.dtype(dtype).itemsize].numpy().view(dtype).reshape(shape)


def test_cuda_regions_are_read_in_place_and_written():
    device = FakeDevice(a=256)
    registry = SharedMemoryRegistry(cuda=device)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    _put(device.memory("a"), 64, x)
    registry.register_cuda("in", device.handle("a"), 0, 128)
    assert registry.status(kind=CUDA) == [{"name": "in", "device_id": 0, "byte_size": 128}]
    assert registry.status(kind=SYSTEM) == [] and device.opened == [(0, 128)]
    assert "cuda_shared_memory" in registry.extensions

    got = registry.read("input 'x'", TensorRef("in", 64, 32), "FP32", np.float32, [2, 4])
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and list(got.shape) == [2, 4]
    np.testing.assert_array_equal(got.numpy(), x)
    _put(device.memory("a"), 64, x + 1)  # a view, not a copy: the engine reads the client's memory
    np.testing.assert_array_equal(got.numpy(), x + 1)

    registry.write("output 'y'", TensorRef("in", 0, 32), x * 3)
    np.testing.assert_array_equal(_get(device.memory("a"), 0, np.float32, [2, 4]), x * 3)

    with pytest.raises(BadRequest, match="not a multiple of 4"):
        registry.read("input 'x'", TensorRef("in", 2, 32), "FP32", np.float32, [2, 4])
    with pytest.raises(BadRequest, match="runs past the end of shared memory region 'in'"):
        registry.read("input 'x'", TensorRef("in", 112, 32), "FP32", np.float32, [2, 4])
    with pytest.raises(BadRequest, match="too small"):
        registry.write("output 'y'", TensorRef("in", 0, 16), x)


def test_cuda_and_system_regions_share_one_namespace_but_not_their_calls():
    device = FakeDevice(a=64, b=64)
    registry = SharedMemoryRegistry(cuda=device)
    registry.register_cuda("r", device.handle("a"), 0, 64)
    with pytest.raises(AlreadyExists, match="already registered \\(as cuda shared memory\\)"):
        registry.register_cuda("r", device.handle("b"), 0, 64)
    with pytest.raises(AlreadyExists, match="'r' is already registered"):
        registry.register("r", "/whatever", 0, 16)
    with pytest.raises(RegionNotFound, match="no system shared memory region 'r'"):
        registry.status("r", SYSTEM)
    registry.unregister("r", SYSTEM)  # a system unregister leaves a CUDA region alone
    registry.unregister(kind=SYSTEM)
    assert [r["name"] for r in registry.status(kind=CUDA)] == ["r"]
    registry.unregister("r", CUDA)
    assert registry.status(kind=CUDA) == []
    registry.register_cuda("r", device.handle("b"), 0, 64)  # the name is free again
    registry.close()
    assert registry.status(kind=CUDA) == []


def test_bad_cuda_registrations_name_the_problem():
    device = FakeDevice(a=64)
    registry = SharedMemoryRegistry(cuda=device)
    for args, words in [((HANDLE, 0, 64), "does not open"), ((device.handle("a"), 0, 65), "larger than the allocation"),
                        ((device.handle("a"), 0, 0), "byte_size must be positive"),
                        ((device.handle("a"), -1, 8), "device_id must be a non-negative integer"),
                        (("not bytes", 0, 8), "raw_handle must be the handle's bytes")]:
        with pytest.raises(BadRequest, match=words):
            registry.register_cuda("r", *args)
    with pytest.raises(BadRequest, match="invalid shared memory region name"):
        registry.register_cuda("", device.handle("a"), 0, 8)
    assert registry.status(kind=CUDA) == []
    host_only = SharedMemoryRegistry()
    assert host_only.extensions == ["system_shared_memory"]
    with pytest.raises(Unsupported, match="needs a server on a GPU"):
        host_only.register_cuda("r", device.handle("a"), 0, 8)


def test_both_protocols_parse_inputs_as_region_views():
    from tritonclient.grpc import service_pb2

    from kiln.serve.grpc_server import decode_inputs
    from kiln.serve.http import parse_infer_request

    device = FakeDevice(a=64)
    registry = SharedMemoryRegistry(cuda=device)
    registry.register_cuda("in", device.handle("a"), 0, 64)
    x = np.arange(4, dtype=np.int64)
    _put(device.memory("a"), 32, x)
    params = {"shared_memory_region": "in", "shared_memory_offset": 32, "shared_memory_byte_size": 32}
    body = json.dumps({"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 4], "parameters": params}]})
    http_ids = parse_infer_request(body.encode(), None, {"ids": "INT64"}, shared_memory=registry).inputs["ids"]
    request = service_pb2.ModelInferRequest(model_name="m")
    t = request.inputs.add(name="ids", datatype="INT64", shape=[1, 4])
    t.parameters["shared_memory_region"].string_param = "in"
    t.parameters["shared_memory_offset"].int64_param = 32
    t.parameters["shared_memory_byte_size"].int64_param = 32
    grpc_ids = decode_inputs(request, registry)["ids"]
    for got in (http_ids, grpc_ids):
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), x[None])


class _TensorEngine:
    """y = 2 x + 1 on whatever it is fed (a CPU engine answers tensors with tensors); records each batch's rows."""

    def __init__(self):
        self.rows: list[int] = []

    def create_context(self, **options):
        return self

    def run(self, feeds):
        self.rows.append(len(feeds["x"]))
        return {"y": feeds["x"] * 2 + 1}

    def download(self, outputs):
        return {k: v.numpy() for k, v in outputs.items()}


def test_region_views_are_batched_and_split_exactly():
    """Requests whose inputs are region views merge into one batch (device tensors, concatenated on their device);
    each gets exactly its rows. A host-array request never joins a batch of views."""
    device = FakeDevice(a=1024)
    registry = SharedMemoryRegistry(cuda=device)
    registry.register_cuda("in", device.handle("a"), 0, 1024)
    xs = [np.full((rows, 4), i, np.float32) for i, rows in enumerate((1, 2, 3), start=1)]
    at = 0
    views = []
    for x in xs:
        _put(device.memory("a"), at, x)
        views.append(registry.read("input 'x'", TensorRef("in", at, x.nbytes), "FP32", np.float32, list(x.shape)))
        at += x.nbytes
    engine = _TensorEngine()
    batcher = DynamicBatcher(engine, max_batch_size=16, max_queue_delay_s=0.05, name="views")
    host = np.full((2, 4), 9, np.float32)

    async def main():
        answers = await asyncio.gather(*(batcher.submit({"x": v}, len(v)) for v in views),
                                       batcher.submit({"x": host}, 2))
        await batcher.close()
        return answers

    answers = asyncio.run(main())
    for x, answer in zip([*xs, host], answers):
        assert isinstance(answer["y"], np.ndarray)
        np.testing.assert_array_equal(answer["y"], x * 2 + 1)
    assert sorted(engine.rows) == [2, 6]  # the three views in one batch, the host request in its own


def test_requests_mixing_region_views_and_host_arrays_are_batched():
    """One input in a CUDA region, another sent over the socket: such requests merge, the view batched as a tensor
    and the array on the host, and each gets exactly its rows (a lone request's view goes to the engine as it is)."""
    device = FakeDevice(a=1024)
    registry = SharedMemoryRegistry(cuda=device)
    registry.register_cuda("in", device.handle("a"), 0, 1024)
    seen = []

    class Engine:
        def create_context(self, **options):
            return self

        def run(self, feeds):
            seen.append({k: type(v).__name__ for k, v in feeds.items()})
            return {"y": torch.as_tensor(feeds["a"]) * 2 + torch.as_tensor(feeds["b"])}

        def download(self, outputs):
            return {k: v.numpy() for k, v in outputs.items()}

    batcher = DynamicBatcher(Engine(), max_batch_size=16, max_queue_delay_s=0.05, name="mixed")
    requests = []
    for i, rows in enumerate((2, 1, 3)):
        a = np.full((rows, 4), i, np.float32)
        _put(device.memory("a"), 256 * i, a)
        view = registry.read("input 'a'", TensorRef("in", 256 * i, a.nbytes), "FP32", np.float32, [rows, 4])
        requests.append((a, view, np.full((rows, 4), 10 * i, np.float32)))

    async def main():
        merged = await asyncio.gather(*(batcher.submit({"a": v, "b": b}, len(b)) for _, v, b in requests))
        alone = await batcher.submit({"a": requests[0][1], "b": requests[0][2]}, 2)
        await batcher.close()
        return merged, alone

    merged, alone = asyncio.run(main())
    for (a, _, b), answer in zip(requests, merged):
        np.testing.assert_array_equal(answer["y"], a * 2 + b)
    np.testing.assert_array_equal(alone["y"], requests[0][0] * 2 + requests[0][2])
    assert seen == [{"a": "Tensor", "b": "ndarray"}] * 2  # one merged batch, then the lone request


def test_a_view_of_the_wrong_dtype_is_refused():
    from kiln.serve.config import ModelConfig, TensorConfig
    from kiln.serve.model import ServedModel

    cfg = ModelConfig("m", max_batch_size=4, input=[TensorConfig("x", "FP32", [4])],
                      output=[TensorConfig("y", "FP32", [4])])
    served = ServedModel("m", "1", cfg, _TensorEngine())

    async def main():
        try:
            with pytest.raises(BadRequest, match="datatype torch.int32 does not match the model's FP32"):
                await served.infer({"x": torch.zeros((1, 4), dtype=torch.int32)})
            return await served.infer({"x": torch.ones((1, 4))})
        finally:
            await served.batcher.close()

    np.testing.assert_array_equal(asyncio.run(main())["y"], np.full((1, 4), 3, np.float32))


async def _asgi(app, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    """One request to an ASGI app in-process: (status, the JSON answer or None)."""
    data = json.dumps(body).encode() if body is not None else b""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-length", str(len(data)).encode())], "server": ("kiln", 80),
             "client": ("127.0.0.1", 1)}
    messages = [{"type": "http.request", "body": data, "more_body": False}]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(answer) if answer else None


def test_http_register_decodes_the_handle():
    """The HTTP register body carries the handle as {"b64": ...}: decoded before the registry opens it."""
    from kiln.serve.http import create_app

    device = FakeDevice(a=64)
    registry = SharedMemoryRegistry(cuda=device)

    class Repo:
        def ready(self):
            return True

    app = create_app(Repo(), shared_memory=registry)
    b64 = base64.b64encode(device.handle("a")).decode()
    body = {"raw_handle": {"b64": f"{b64[:72]}\n{b64[72:]}\n"}, "device_id": 0, "byte_size": 64}  # as libb64 writes

    register = "/v2/cudasharedmemory/region/{}/register"

    async def main():
        return [await _asgi(app, "POST", register.format("r"), body),
                await _asgi(app, "GET", "/v2/cudasharedmemory/status"),
                await _asgi(app, "POST", register.format("s"), {**body, "raw_handle": {"b64": "%"}}),
                await _asgi(app, "POST", register.format("s"), {"byte_size": 64}),
                await _asgi(app, "GET", "/v2"),
                await _asgi(app, "GET", "/v2/systemsharedmemory/status"),
                await _asgi(app, "POST", "/v2/cudasharedmemory/region/r/unregister"),
                await _asgi(app, "GET", "/v2/cudasharedmemory/region/r/status")]

    ok, status, bad, missing, meta, system, gone, after = asyncio.run(main())
    assert ok == (200, None) and status == (200, [{"name": "r", "device_id": 0, "byte_size": 64}])
    assert bad[0] == 400 and "not base64" in bad[1]["error"]
    assert missing[0] == 400 and "raw_handle must be" in missing[1]["error"]
    assert "cuda_shared_memory" in meta[1]["extensions"] and system == (200, [])
    assert gone == (200, None) and after[0] == 404 and "no cuda shared memory region 'r'" in after[1]["error"]


@pytest.mark.gpu
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("frontends", [0, 2])
def test_gpu_server_batches_inputs_from_cuda_regions(tmp_path, protocol, frontends):
    """A real `kiln serve --device cuda --shared-memory` (one process, or front ends with the regions in the engine
    process): eight client threads each pass their input and output through CUDA regions that tritonclient made;
    requests merge into batches and every output is exact."""
    from concurrent.futures import ThreadPoolExecutor

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("cuda.bindings", reason="CUDA shared memory needs cuda-python")
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    client_module = pytest.importorskip(f"tritonclient.{protocol}")
    import kiln
    from test_http import _affine_onnx, serving

    folder = tmp_path / "models" / "affine" / "1"
    folder.mkdir(parents=True)
    engine = kiln.build(str(_affine_onnx(tmp_path / "affine.onnx")),
                        kiln.BuildConfig(device="cuda", profiles=({"x": ((1, 4), (4, 4), (16, 4))},)))
    engine.save(str(folder / "model.plan"))
    (folder.parent / "config.toml").write_text("max_batch_size = 16\n[dynamic_batching]\n"
                                               "max_queue_delay_microseconds = 5000\n")
    threads, rows = 8, 2
    xs = [np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 100 * i for i in range(threads)]
    size = xs[0].nbytes
    regions = [cudashm.create_shared_memory_region(f"kiln_{k}", size * threads, 0) for k in ("in", "out")]
    try:
        cudashm.set_shared_memory_region(regions[0], xs)
        extra = ["--frontends", str(frontends)] if frontends else []
        with serving(tmp_path / "models", "--device", "cuda", "--shared-memory", *extra, timeout_s=300) as (
                url, grpc_url, _, log):
            target = url if protocol == "http" else grpc_url
            client = client_module.InferenceServerClient(target)
            for name, region in zip(("in", "out"), regions):
                raw = cudashm.get_raw_handle(region)
                client.register_cuda_shared_memory(name, raw if protocol == "grpc" else raw.decode(), 0, size * threads)
            status = client.get_cuda_shared_memory_status(as_json=True) if protocol == "grpc" else \
                client.get_cuda_shared_memory_status()
            assert len(status["regions"] if protocol == "grpc" else status) == 2

            def infer(i: int) -> None:
                c = client_module.InferenceServerClient(target)
                inp = client_module.InferInput("x", [rows, 4], "FP32")
                inp.set_shared_memory("in", size, i * size)
                out = client_module.InferRequestedOutput("y")
                out.set_shared_memory("out", size, i * size)
                for _ in range(5):
                    c.infer("affine", [inp], outputs=[out])

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(infer, range(threads)))
            got = cudashm.get_contents_as_numpy(regions[1], np.float32, [threads, rows, 4])
            np.testing.assert_allclose(got, np.stack(xs) * 2 + 1, rtol=1e-3)
            for _ in range(50):  # a front end's statistics are the engine's of up to 0.2 s ago
                stats = client.get_inference_statistics("affine", as_json=True) if protocol == "grpc" else \
                    client.get_inference_statistics("affine")
                sizes = [int(b["batch_size"]) for b in stats["model_stats"][0].get("batch_stats", [])]
                if sum(sizes) and int(stats["model_stats"][0]["inference_count"]) == threads * 5 * rows:
                    break
                time.sleep(0.1)
            assert max(sizes) > rows, sizes  # requests merged into batches
            client.unregister_cuda_shared_memory()
            assert "shared memory (system and cuda): on" in log.read_text()
            if not frontends:  # kiln loadgen's client threads, each with its own CUDA regions
                from kiln.cli.loadgen import run_load

                report = run_load(target, "affine", {"x": xs[0]}, protocol=protocol, concurrency=3, requests=30,
                                  shared_memory="cuda")
                assert report["succeeded"] == 30 and report["failed"] == 0, report["error_examples"]
                assert (client.get_cuda_shared_memory_status(as_json=True) if protocol == "grpc" else
                        client.get_cuda_shared_memory_status()) in ([], {})  # loadgen unregistered its regions
    finally:
        for region in regions:
            cudashm.destroy_shared_memory_region(region)
