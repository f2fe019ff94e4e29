"""kiln's gRPC server (serve/grpc_server.py) driven by tritonclient's own gRPC client.

One server per module, in-process on an asyncio loop in a background thread, over a repository holding one model
(y = x * 2 + 1, FP32 [-1, 4], built on the CPU with a dynamic batch dim).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


def _affine_onnx():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])], "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


class _Server:
    """The gRPC server over `root`, served by an event loop in a daemon thread."""

    def __init__(self, root):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self.call(self._start(root), timeout=60)

    def call(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, root):
        from kiln.serve.grpc_server import create_grpc_server
        from kiln.serve.repository import ModelRepository

        self.repo = ModelRepository(root, device="cpu")
        await _maybe_await(self.repo.start(load_all=True))
        self.server = create_grpc_server(self.repo, "127.0.0.1", 0)
        await self.server.start()
        return self.server.kiln_port

    async def _stop(self):
        await self.server.stop(grace=1)
        await self.repo.close()

    def stop(self):
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import kiln

    root = tmp_path_factory.mktemp("repo")
    engine = kiln.build(_affine_onnx(), kiln.BuildConfig(device="cpu", profiles=({"x": ((1, 4), (4, 4), (64, 4))},)))
    (root / "m" / "1").mkdir(parents=True)
    engine.save(root / "m" / "1" / "model.plan")
    running = _Server(root)
    yield running
    running.stop()


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    yield c
    c.close()


def _infer(client, x: np.ndarray, model="m", datatype="FP32", outputs=None):
    inp = grpcclient.InferInput("x", list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], outputs=outputs)


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("m")
    assert not client.is_model_ready("nope")
    assert client.is_model_ready("m", "1") and not client.is_model_ready("m", "7")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "kiln" and "model_repository" in meta["extensions"]


def test_model_metadata_and_config(client):
    meta = client.get_model_metadata("m", as_json=True)
    assert meta["name"] == "m"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["-1", "4"]}]
    config = client.get_model_config("m", as_json=True)["config"]
    assert config["name"] == "m" and int(config["max_batch_size"]) >= 1
    assert config["input"][0]["name"] == "x" and config["input"][0]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in config["input"][0]["dims"]] == [4]
    assert config["output"][0]["name"] == "y"


def test_infer_exact(client):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    result = _infer(client, x)
    y = result.as_numpy("y")
    assert y.dtype == np.float32 and y.shape == (3, 4)
    np.testing.assert_array_equal(y, x * 2 + 1)
    # the named output, requested explicitly
    result = _infer(client, x[:1], outputs=[grpcclient.InferRequestedOutput("y")])
    np.testing.assert_array_equal(result.as_numpy("y"), x[:1] * 2 + 1)
    assert result.get_response().model_name == "m"


def test_infer_tensor_contents(server):
    """Inputs sent as typed InferTensorContents (not raw bytes), as other clients do, decode the same."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    x = np.array([[0.5, -1.25, 3.0, 7.0], [1, 2, 3, 4]], dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert [o.name for o in response.outputs] == ["y"] and list(response.outputs[0].shape) == [2, 4]
    y = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 4)
    np.testing.assert_array_equal(y, x * 2 + 1)


def test_concurrent_infers_exact(client):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((int(n), 4)).astype(np.float32) for n in rng.integers(1, 9, size=24)]
    with ThreadPoolExecutor(8) as pool:
        ys = list(pool.map(lambda x: _infer(client, x).as_numpy("y"), xs))
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, x * 2 + 1)


def test_statistics(client):
    _infer(client, np.ones((2, 4), np.float32))
    stats = client.get_inference_statistics("m", as_json=True)["model_stats"]
    assert len(stats) == 1 and stats[0]["name"] == "m"
    assert int(stats[0]["inference_stats"]["success"]["count"]) >= 1
    assert int(stats[0]["inference_count"]) >= 2
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert [s["name"] for s in everything] == ["m"]


def test_repository_index_unload_load(server, client):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    index = client.get_model_repository_index(as_json=True)["models"]
    assert [(m["name"], m["state"]) for m in index] == [("m", "READY")]
    client.unload_model("m")
    try:
        assert not client.is_model_ready("m")
        assert [m["state"] for m in client.get_model_repository_index(as_json=True)["models"]] == ["UNAVAILABLE"]
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:  # only the ready ones
            ready = service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(
                service_pb2.RepositoryIndexRequest(ready=True), timeout=30)
        assert list(ready.models) == []
        with pytest.raises(InferenceServerException) as e:
            _infer(client, np.ones((1, 4), np.float32))
        assert "UNAVAILABLE" in str(e.value.status())
    finally:
        client.load_model("m")
    assert client.is_model_ready("m")
    np.testing.assert_array_equal(_infer(client, np.zeros((1, 4), np.float32)).as_numpy("y"), np.ones((1, 4)))


def test_errors(client):
    with pytest.raises(InferenceServerException) as e:
        _infer(client, np.ones((1, 4), np.float32), model="nope")
    assert "NOT_FOUND" in str(e.value.status())
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics("nope")
    assert "NOT_FOUND" in str(e.value.status())
    with pytest.raises(InferenceServerException) as e:  # wrong dtype
        _infer(client, np.ones((1, 4), np.int32), datatype="INT32")
    assert "INVALID_ARGUMENT" in str(e.value.status()) and "x" in e.value.message()
    with pytest.raises(InferenceServerException) as e:  # wrong shape
        _infer(client, np.ones((1, 5), np.float32))
    assert "INVALID_ARGUMENT" in str(e.value.status())
    with pytest.raises(InferenceServerException) as e:  # unknown output
        _infer(client, np.ones((1, 4), np.float32), outputs=[grpcclient.InferRequestedOutput("z")])
    assert "INVALID_ARGUMENT" in str(e.value.status())
    with pytest.raises(InferenceServerException) as e:  # a path for a model name
        client.load_model("../m")
    assert "INVALID_ARGUMENT" in str(e.value.status())
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("r", "/k", 16)
    assert "UNIMPLEMENTED" in str(e.value.status())
    assert client.is_server_live()  # the server survives all of it


def test_raw_size_mismatch(server):
    """raw_input_contents of the wrong byte length is refused, naming the input."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(b"\0" * 12)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.RpcError) as e:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'x'" in e.value.details()


def test_max_message_size(tmp_path):
    """A message above the limit is refused by grpc itself (RESOURCE_EXHAUSTED); the limit is configurable."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from kiln.serve.grpc_server import create_grpc_server

    class _NoRepo:
        def ready(self):
            return True

    async def main():
        srv = create_grpc_server(_NoRepo(), "127.0.0.1", 0, max_message_bytes=1024)
        await srv.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.kiln_port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                assert (await stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=10)).ready
                request = service_pb2.ModelInferRequest(model_name="m")
                request.raw_input_contents.append(b"\0" * 4096)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.ModelInfer(request, timeout=10)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            await srv.stop(grace=None)

    asyncio.run(main())


def test_unexpected_error_is_internal():
    """An exception that is not a ServeError is kiln's bug: INTERNAL, "bug in kiln", no details leaked."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from kiln.serve.grpc_server import create_grpc_server

    class _BrokenRepo:
        def get(self, name, version=None):
            raise RuntimeError("secret internals")

    async def main():
        srv = create_grpc_server(_BrokenRepo(), "127.0.0.1", 0)
        await srv.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.kiln_port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="m"), timeout=10)
                assert e.value.code() == grpc.StatusCode.INTERNAL
                assert "bug in kiln" in e.value.details() and "secret" not in e.value.details()
        finally:
            await srv.stop(grace=None)

    asyncio.run(main())
