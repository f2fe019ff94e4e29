"""Triton's system shared memory extension: the registry in-process, then a real `kiln serve --shared-memory` process
driven by tritonclient (and its shared memory utilities) over HTTP and gRPC."""

from __future__ import annotations

import base64
import http.client
import json
import os
import uuid

import numpy as np
import pytest
import torch
from test_http import affine_repository, serving

from kiln.errors import ConfigError
from kiln.serve.errors import AlreadyExists, BadRequest, RegionNotFound
from kiln.serve.shared_memory import SharedMemoryRegistry, TensorRef, tensor_ref

shm = pytest.importorskip("tritonclient.utils.shared_memory")
grpcclient = pytest.importorskip("tritonclient.grpc")
import tritonclient.http as httpclient  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shared memory in /dev/shm")
MODEL = "affine"


@pytest.fixture
def objects():
    """make(name, byte_size) -> (handle, key): shared memory objects made with tritonclient, destroyed after."""
    tag, made = f"kiln_test_{os.getpid()}_{uuid.uuid4().hex[:8]}", []

    def make(name: str, byte_size: int):
        key = f"/{tag}_{name}"
        made.append(shm.create_shared_memory_region(name, key, byte_size, create_only=True))
        return made[-1], key

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(tag)]


def _contents(handle, shape, offset=0) -> np.ndarray:
    view = shm.get_contents_as_numpy(handle, np.float32, shape, offset)
    out = view.copy()
    del view  # a view left alive would keep the object from being closed
    return out


# ---------------------------------------------------------------- the registry, in-process


def test_registry_reads_writes_and_checks(objects):
    handle, key = objects("reg", 8192)
    registry = SharedMemoryRegistry()
    try:
        registry.register("r", key, 4100, 64)  # an offset mmap cannot take as is (not page-aligned)
        assert registry.status() == [{"name": "r", "key": key, "offset": 4100, "byte_size": 64}]
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        shm.set_shared_memory_region(handle, [x], offset=4100 + 16)
        got = registry.read("input 'x'", TensorRef("r", 16, 32), "FP32", np.float32, [2, 4])
        np.testing.assert_array_equal(got, x)
        registry.write("output 'y'", TensorRef("r", 0, 48), x * 3)
        np.testing.assert_array_equal(_contents(handle, [2, 4], 4100), x * 3)

        with pytest.raises(AlreadyExists, match="'r' is already registered"):
            registry.register("r", key, 0, 16)
        with pytest.raises(BadRequest, match="runs past the end"):
            registry.register("big", key, 8000, 200)
        with pytest.raises(BadRequest, match="no shared memory object"):
            registry.register("gone", "/kiln_no_such_object_here", 0, 16)
        for bad in ("/../etc/passwd", "/a/b", "..", "/", "", "x\\y", 7):
            with pytest.raises(BadRequest, match="invalid shared memory key"):
                registry.register("bad", bad, 0, 16)
        with pytest.raises(BadRequest, match="byte_size must be positive"):
            registry.register("zero", key, 0, 0)
        with pytest.raises(BadRequest, match="offset must be a non-negative integer"):
            registry.register("neg", key, -1, 16)
        with pytest.raises(BadRequest, match="does not match shape"):
            registry.read("input 'x'", TensorRef("r", 0, 28), "FP32", np.float32, [2, 4])
        with pytest.raises(BadRequest, match="runs past the end of shared memory region 'r'"):
            registry.read("input 'x'", TensorRef("r", 40, 32), "FP32", np.float32, [2, 4])
        with pytest.raises(BadRequest, match="too small"):
            registry.write("output 'y'", TensorRef("r", 0, 16), x)
        with pytest.raises(RegionNotFound, match="'nope'"):
            registry.read("input 'x'", TensorRef("nope", 0, 32), "FP32", np.float32, [2, 4])
        with pytest.raises(RegionNotFound):
            registry.status("nope")
        registry.unregister("nope")  # an unknown name is no error (as Triton)
        registry.unregister("r")
        assert registry.status() == []
    finally:
        registry.close()


def test_registry_refuses_a_symlink(objects, tmp_path):
    _, key = objects("target", 64)
    link = f"kiln_test_link_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    os.symlink(f"/dev/shm{key}", f"/dev/shm/{link}")
    registry = SharedMemoryRegistry()
    try:
        with pytest.raises(BadRequest, match="cannot open"):
            registry.register("l", f"/{link}", 0, 16)
    finally:
        os.unlink(f"/dev/shm/{link}")
        registry.close()


def test_tensor_ref_parameters():
    assert tensor_ref("input 'x'", {"binary_data_size": 4}) is None
    ref = tensor_ref("input 'x'", {"shared_memory_region": "r", "shared_memory_byte_size": 16,
                                   "shared_memory_offset": 8})
    assert ref == TensorRef("r", 8, 16)
    with pytest.raises(BadRequest, match="needs both"):
        tensor_ref("input 'x'", {"shared_memory_region": "r"})
    with pytest.raises(BadRequest, match="shared_memory_byte_size must be"):
        tensor_ref("input 'x'", {"shared_memory_region": "r", "shared_memory_byte_size": True})


def test_grpc_raw_contents_skip_inputs_in_shared_memory(objects):
    """raw_input_contents holds the inputs not in shared memory, in order (as tritonclient sends them)."""
    from tritonclient.grpc import service_pb2

    from kiln.serve.grpc_server import decode_inputs

    handle, key = objects("mixed", 16)
    shm.set_shared_memory_region(handle, [np.full(4, 7, np.float32)])
    registry = SharedMemoryRegistry()
    try:
        registry.register("m", key, 0, 16)
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        a = request.inputs.add(name="a", datatype="FP32", shape=[4])
        a.parameters["shared_memory_region"].string_param = "m"
        a.parameters["shared_memory_byte_size"].int64_param = 16
        request.inputs.add(name="b", datatype="FP32", shape=[2])
        request.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
        got = decode_inputs(request, registry)
        assert got["a"].tolist() == [7] * 4 and got["b"].tolist() == [1, 2]
    finally:
        registry.close()


# ---------------------------------------------------------------- a real server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = affine_repository(tmp_path_factory.mktemp("shm") / "models")
    with serving(root, "--shared-memory", timeout_s=60) as (url, grpc_url, proc, log):
        yield url, grpc_url, log


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    """A tritonclient of either protocol; every region is unregistered after the test."""
    url, grpc_url, _ = server
    module = httpclient if request.param == "http" else grpcclient
    c = module.InferenceServerClient(url if request.param == "http" else grpc_url)
    c.kiln_module = module
    yield c
    c.unregister_system_shared_memory()
    c.close()


def _status(client) -> list[dict]:
    if client.kiln_module is httpclient:
        return client.get_system_shared_memory_status()
    regions = client.get_system_shared_memory_status(as_json=True).get("regions", {})
    return [{"name": r["name"], "key": r["key"], "offset": int(r.get("offset", 0)), "byte_size": int(r["byte_size"])}
            for r in regions.values()]  # JSON leaves out a zero


def _infer(client, x=None, *, region_in=None, region_out=None, offset_in=0, size_in=None, size_out=None):
    module = client.kiln_module
    inp = module.InferInput("x", [2, 4], "FP32")
    if region_in is None:
        inp.set_data_from_numpy(x)
    else:
        inp.set_shared_memory(region_in, 32 if size_in is None else size_in, offset_in)
    out = module.InferRequestedOutput("y")
    if region_out is not None:
        out.set_shared_memory(region_out, 32 if size_out is None else size_out)
    return client.infer(MODEL, [inp], outputs=[out])


def _output_meta(result) -> dict:
    out = result.get_output("y")
    if isinstance(out, dict):
        return out
    return {"datatype": out.datatype, "shape": list(out.shape),
            "parameters": {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in out.parameters.items()}}


def test_infer_through_shared_memory(client, objects):
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    want = _infer(client, x).as_numpy("y")
    ih, ikey = objects("in", 64 + x.nbytes)
    oh, okey = objects("out", x.nbytes)
    shm.set_shared_memory_region(ih, [x], offset=64)
    client.register_system_shared_memory("in", ikey, 64 + x.nbytes)
    client.register_system_shared_memory("out", okey, x.nbytes)
    assert "system_shared_memory" in (client.get_server_metadata(as_json=True)
                                      if client.kiln_module is grpcclient else client.get_server_metadata())[
                                          "extensions"]
    assert sorted(_status(client), key=lambda r: r["name"]) == [
        {"name": "in", "key": ikey, "offset": 0, "byte_size": 64 + x.nbytes},
        {"name": "out", "key": okey, "offset": 0, "byte_size": x.nbytes}]

    result = _infer(client, region_in="in", offset_in=64, region_out="out")  # both ways through shared memory
    meta = _output_meta(result)
    assert meta["datatype"] == "FP32" and [int(d) for d in meta["shape"]] == [2, 4]
    assert not meta.get("parameters") and "data" not in meta  # as Triton answers: the data is in the region
    np.testing.assert_array_equal(_contents(oh, [2, 4]), want)
    shm.set_shared_memory_region(oh, [np.zeros_like(x)])
    np.testing.assert_array_equal(_infer(client, region_in="in", offset_in=64).as_numpy("y"), want)  # input only
    _infer(client, x, region_out="out")  # output only
    np.testing.assert_array_equal(_contents(oh, [2, 4]), want)

    client.unregister_system_shared_memory("in")
    assert [r["name"] for r in _status(client)] == ["out"]
    with pytest.raises(InferenceServerException) as e:
        _infer(client, region_in="in", offset_in=64)
    assert "no shared memory region 'in'" in e.value.message()


def test_bad_requests_name_the_problem(client, objects, server):
    grpc = client.kiln_module is grpcclient
    ih, ikey = objects("in", 64)
    oh, okey = objects("out", 16)

    def refused(call, *words, code=None):
        with pytest.raises(InferenceServerException) as e:
            call()
        for w in words:
            assert w in e.value.message(), e.value.message()
        if code is not None:
            assert code[grpc] in str(e.value.status()), e.value.status()

    invalid = ("400", "INVALID_ARGUMENT")
    client.register_system_shared_memory("in", ikey, 64)
    client.register_system_shared_memory("out", okey, 16)
    refused(lambda: client.register_system_shared_memory("in", ikey, 64), "'in' is already registered",
            code=("400", "ALREADY_EXISTS"))
    refused(lambda: client.register_system_shared_memory("past", ikey, 64, offset=8), "runs past the end",
            code=invalid)
    refused(lambda: client.register_system_shared_memory("bad", "/../etc/passwd", 16), "invalid shared memory key",
            code=invalid)
    refused(lambda: client.register_system_shared_memory("gone", "/kiln_no_such_object_x", 16),
            "no shared memory object", code=invalid)
    refused(lambda: client.get_system_shared_memory_status("nope"), "'nope'", code=("404", "NOT_FOUND"))
    refused(lambda: _infer(client, region_in="nope"), "input 'x'", "'nope'", code=("404", "NOT_FOUND"))
    refused(lambda: _infer(client, region_in="in", size_in=28), "does not match shape", code=invalid)
    refused(lambda: _infer(client, region_in="in", offset_in=48), "runs past the end", code=invalid)
    refused(lambda: _infer(client, np.ones((2, 4), np.float32), region_out="out", size_out=16), "output 'y'",
            "too small", code=invalid)
    refused(lambda: _infer(client, np.ones((2, 4), np.float32), region_out="out"), "output 'y'",
            "runs past the end", code=invalid)
    assert client.is_server_live()


def test_raw_http_shared_memory_routes(server, objects):
    url = server[0]
    _, key = objects("raw", 32)

    def request(method, path, body=b""):
        conn = http.client.HTTPConnection(url, timeout=10)
        try:
            conn.request(method, path, body=body)
            r = conn.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            conn.close()

    register = "/v2/systemsharedmemory/region/raw/register"
    assert request("POST", register, json.dumps({"key": key, "offset": 0, "byte_size": 32}).encode())[0] == 200
    assert request("GET", "/v2/systemsharedmemory/region/raw/status") == (
        200, [{"name": "raw", "key": key, "offset": 0, "byte_size": 32}])
    status, doc = request("POST", register.replace("raw", "r2"), b'{"key": 5, "byte_size": 32}')
    assert status == 400 and "invalid shared memory key" in doc["error"]
    status, doc = request("POST", register.replace("raw", "r2"), json.dumps({"key": key, "byte_size": "x"}).encode())
    assert status == 400 and "byte_size" in doc["error"]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [0] * 8,
                        "parameters": {"shared_memory_region": "raw", "shared_memory_byte_size": 32}}]}
    status, doc = request("POST", f"/v2/models/{MODEL}/infer", json.dumps(body).encode())
    assert status == 400 and "both" in doc["error"]
    assert request("POST", "/v2/systemsharedmemory/region/raw/unregister")[0] == 200
    assert request("POST", "/v2/systemsharedmemory/unregister")[0] == 200
    assert request("GET", "/v2/systemsharedmemory/status") == (200, [])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_loadgen_through_shared_memory(server, protocol):
    from kiln.cli.loadgen import run_load

    url, grpc_url, _ = server
    feeds = {"x": np.ones((2, 4), np.float32)}
    report = run_load(url if protocol == "http" else grpc_url, MODEL, feeds, protocol=protocol, concurrency=3,
                      requests=30, shared_memory="system")
    assert report["succeeded"] == 30 and report["failed"] == 0, report["error_examples"]
    assert report["shared_memory"] == "system"
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"kiln_loadgen_{os.getpid()}_")]
    assert httpclient.InferenceServerClient(url).get_system_shared_memory_status() == []
    target = url if protocol == "http" else grpc_url
    named = run_load(target, MODEL, feeds, protocol=protocol, requests=5, shared_memory="system", outputs=["y"])
    assert named["succeeded"] == 5, named["error_examples"]
    with pytest.raises(ConfigError, match="no output 'nope'"):
        run_load(target, MODEL, feeds, protocol=protocol, requests=1, shared_memory="system", outputs=["nope"])


def test_loadgen_shared_memory_needs_this_machine():
    from typer.testing import CliRunner

    from kiln.cli.app import app

    result = CliRunner().invoke(app, ["loadgen", "10.0.0.7:8001", MODEL, "-n", "1", "--allow-remote",
                                      "--shared-memory", "system"])
    assert result.exit_code != 0 and "needs a server on this machine" in result.stderr
    result = CliRunner().invoke(app, ["loadgen", "127.0.0.1:1", MODEL, "-n", "1", "--shared-memory", "gpu"])
    assert result.exit_code != 0 and "none, system, cuda" in result.stderr
    if not torch.cuda.is_available():  # refused before any request, saying why
        result = CliRunner().invoke(app, ["loadgen", "127.0.0.1:1", MODEL, "-n", "1", "--shared-memory", "cuda"])
        assert result.exit_code != 0 and "--shared-memory cuda needs" in result.stderr, result.stderr


def test_cuda_shared_memory_needs_a_gpu_server(client):
    """This CPU server serves system shared memory only: a CUDA region is refused, naming why."""
    grpc = client.kiln_module is grpcclient
    raw = base64.b64encode(bytes(64))
    with pytest.raises(InferenceServerException) as e:
        client.register_cuda_shared_memory("c", raw if grpc else raw.decode(), 0, 64)
    assert "needs a server on a GPU" in e.value.message()
    assert ("UNIMPLEMENTED" if grpc else "400") in str(e.value.status())
    meta = client.get_server_metadata(as_json=True) if grpc else client.get_server_metadata()
    assert "system_shared_memory" in meta["extensions"] and "cuda_shared_memory" not in meta["extensions"]
    status = client.get_cuda_shared_memory_status(as_json=True) if grpc else client.get_cuda_shared_memory_status()
    assert status in ([], {})
