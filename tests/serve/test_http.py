"""The KServe v2 HTTP front end: request parsing and response encoding as pure functions, then a real `kiln serve`
process (uvicorn on 127.0.0.1) driven by tritonclient.http and by raw HTTP."""

from __future__ import annotations

import contextlib

import gzip
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kiln.serve.errors import BadRequest
from kiln.serve.http import HEADER_LENGTH, encode_infer_response, parse_infer_request

LIMIT = 64 << 10  # --max-body-bytes of the test server
MODEL = "affine"


# ---------------------------------------------------------------- pure parts


def _binary_request(arrays: dict[str, np.ndarray], datatype="FP32", extra=None) -> tuple[bytes, int]:
    inputs = [{"name": n, "datatype": datatype, "shape": list(a.shape),
               "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()]
    header = json.dumps({"inputs": inputs, **(extra or {})}).encode()
    return header + b"".join(a.tobytes() for a in arrays.values()), len(header)


def test_parse_json_and_binary_inputs():
    body = json.dumps({"id": "r1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],
                                               "data": [[1, 2], [3, 4]]}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
                       "parameters": {"timeout": 2_000_000}}).encode()
    req = parse_infer_request(body, None, {"x": "FP32"})
    assert req.inputs["x"].dtype == np.float32 and req.inputs["x"].tolist() == [[1, 2], [3, 4]]
    assert req.outputs == [("y", True)] and req.id == "r1" and req.timeout_s == 2.0

    a, b = np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((1, 2), np.float32)
    body, n = _binary_request({"a": a, "b": b}, extra={"parameters": {"binary_data_output": True}})
    req = parse_infer_request(body, str(n), {"a": "FP32", "b": "FP32"})
    np.testing.assert_array_equal(req.inputs["a"], a)
    np.testing.assert_array_equal(req.inputs["b"], b)
    assert req.outputs is None and req.binary_default


@pytest.mark.parametrize("body, header, words", [
    (b"{not json", None, ["not valid JSON"]),
    (b"[1]", None, ["JSON object"]),
    (b'{"inputs": []}', None, ["inputs"]),
    (b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}', None,
     ["x", "INT32", "FP32"]),
    (b'{"inputs": [{"name": "z", "datatype": "FP32", "shape": [1], "data": [1]}]}', None, ["unknown input 'z'"]),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2]}]}', None, ["x", "2 values"]),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}', None, ["x", "shape"]),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}]}', None, ["x", "FP32"]),
    (b'{"inputs": [{"name": "x", "datatype": "NOPE", "shape": [1], "data": [1]}]}', None, ["x", "NOPE"]),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}', "x1", [HEADER_LENGTH]),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}', "9999", [HEADER_LENGTH]),
])
def test_parse_refuses_naming_the_problem(body, header, words):
    with pytest.raises(BadRequest) as e:
        parse_infer_request(body, header, {"x": "FP32"})
    for w in words:
        assert w in str(e.value)


def test_parse_refuses_bad_binary_sizes():
    x = np.ones((2, 2), np.float32)
    body, n = _binary_request({"x": x})
    with pytest.raises(BadRequest, match="add up to"):  # trailing bytes nobody claims
        parse_infer_request(body + b"\0\0\0\0", n, None)
    with pytest.raises(BadRequest, match="runs past"):  # header says 16 bytes, 8 sent
        parse_infer_request(body[:-8], n, None)
    lie = body.replace(b'"binary_data_size": 16', b'"binary_data_size": 12')  # same length: 16 → 12
    with pytest.raises(BadRequest, match="does not match shape"):
        parse_infer_request(lie, n, None)
    with pytest.raises(BadRequest, match="binary_data_size"):
        parse_infer_request(body.replace(b"16}", b"-1}"), n, None)


@pytest.mark.parametrize("disconnect", [True, False])
def test_unless_gone_cancels_the_work_only_when_the_client_goes(disconnect):
    import asyncio

    from kiln.serve.errors import ClientGone
    from kiln.serve.http import unless_gone

    async def main():
        cancelled, client_gone = [], asyncio.Event()

        async def receive():  # the ASGI server's next message after the body
            await client_gone.wait()
            return {"type": "http.disconnect"}

        async def work():
            try:
                await asyncio.sleep(0.05)
                return "answer"
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        if disconnect:
            asyncio.get_running_loop().call_later(0.01, client_gone.set)
            with pytest.raises(ClientGone):
                await unless_gone(receive, work())
            assert cancelled and asyncio.current_task().cancelling() == 0  # the handler itself goes on
        else:
            assert await unless_gone(receive, work()) == "answer" and not cancelled
            client_gone.set()  # a disconnect after the answer cancels nothing
            await asyncio.sleep(0.01)

    asyncio.run(main())


@pytest.mark.parametrize("size", [16, 1 << 20])
def test_parts_response_joins_small_outputs_and_streams_large_ones(size):
    import asyncio

    from kiln.serve.http import _PartsResponse, encode_infer_parts

    y = np.arange(size // 4, dtype=np.float32)
    header, blobs = encode_infer_parts("m", "1", {"y": y}, [("y", True)])
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(_PartsResponse(header, blobs)(None, None, send))
    headers = dict(sent[0]["headers"])
    bodies = [m["body"] for m in sent[1:]]
    assert len(bodies) == (1 if size < _PartsResponse.JOIN_BELOW else 2)  # one socket write less when small
    assert [m["more_body"] for m in sent[1:]] == [True] * (len(bodies) - 1) + [False]
    body = b"".join(bodies)
    assert int(headers[b"content-length"]) == len(body) and int(headers[HEADER_LENGTH.lower().encode()]) == len(header)
    assert body[len(header):] == y.tobytes() and all(isinstance(b, bytes) for b in bodies)  # ASGI bodies are bytes


def test_encode_response_json_and_binary():
    y, z = np.arange(4, dtype=np.float32).reshape(2, 2), np.array([True, False])
    body, n = encode_infer_response("m", "1", {"y": y, "z": z}, [("y", False), ("z", False)], "id7")
    assert n is None
    doc = json.loads(body)
    assert doc["id"] == "id7" and doc["outputs"][0] == {"name": "y", "datatype": "FP32", "shape": [2, 2],
                                                         "data": [0, 1, 2, 3]}
    body, n = encode_infer_response("m", "1", {"y": y, "z": z}, [("y", True), ("z", False)])
    from tritonclient.http import InferResult

    result = InferResult.from_response_body(body, header_length=n)
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    np.testing.assert_array_equal(result.as_numpy("z"), z)


# ---------------------------------------------------------------- a real server


def _affine_onnx(path: Path) -> Path:
    """y = x * 2 + 1, x and y [batch, 4] float32."""
    consts = [onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
              onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [helper.make_node("Mul", ["x", "two"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "one"], ["y"], name="add")]
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4])  # noqa: E731
    graph = helper.make_graph(nodes, "affine", [io("x")], [io("y")], initializer=consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def affine_repository(root: Path) -> Path:
    """A model repository at `root` (made here) holding MODEL/1/model.plan: `_affine_onnx` built on the CPU for
    batch 1..64."""
    import kiln

    folder = root / MODEL / "1"
    folder.mkdir(parents=True)
    engine = kiln.build(str(_affine_onnx(root.parent / f"{root.name}-affine.onnx")),
                        kiln.BuildConfig(device="cpu", profiles=({"x": ((1, 4), (4, 4), (64, 4))},)))
    engine.save(str(folder / "model.plan"))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = affine_repository(tmp_path_factory.mktemp("repo") / "models")
    (root / MODEL / "config.toml").write_text("[dynamic_batching]\nmax_queue_delay_microseconds = 2000\n")
    with serving(root, "--max-body-bytes", str(LIMIT), grpc=False, timeout_s=60) as (url, _, proc, log):
        yield url, proc, log


@contextlib.contextmanager
def serving(root: Path, *extra: str, grpc: bool = True, timeout_s: float = 120.0):
    """A `kiln serve ROOT` process on the CPU and free loopback ports, ready; yields (HTTP url, gRPC url or None,
    process, log path) and stops it after."""
    log = root.parent / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kiln", "serve", str(root), "--http-port", "0",
                                 "--grpc-port", "0" if grpc else "-1", "--metrics-port", "-1", "--device", "cpu",
                                 *extra], stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = _wait_ready(proc, log, timeout_s)
        found = re.search(r"gRPC on ([^\s\"]+)", log.read_text())  # a text or a JSON log line
        grpc_url = found.group(1) if grpc and found else None
        yield url, grpc_url, proc, log
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains and exits), then kill if it has not exited within 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(proc, log: Path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"kiln serve exited {proc.returncode}: {log.read_text()}"
        if url is None:
            m = re.search(r"HTTP on http://([^\s\"]+)", log.read_text())
            url = m and m.group(1)
        if url is not None:
            try:
                with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return url
            except (urllib.error.URLError, ConnectionError):
                pass
        time.sleep(0.1)
    raise AssertionError(f"kiln serve not ready in {timeout_s} s: {log.read_text()}")


def _client(url, **kw):
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url, **kw)


def _infer(client, x: np.ndarray, binary: bool):
    import tritonclient.http as httpclient

    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("y", binary_data=binary)
    return client.infer(MODEL, [inp], outputs=[out])


def test_tritonclient_metadata_config_and_infer(server):
    url, _, _ = server
    client = _client(url)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
        meta = client.get_server_metadata()
        assert meta["name"] == "kiln" and {"binary_tensor_data", "model_repository", "statistics"} <= set(
            meta["extensions"])
        md = client.get_model_metadata(MODEL)
        assert md["name"] == MODEL and md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        assert client.get_model_metadata(MODEL, "1")["name"] == MODEL
        cfg = client.get_model_config(MODEL)
        assert cfg["name"] == MODEL and cfg["max_batch_size"] == 64 and cfg["input"][0]["data_type"] == "TYPE_FP32"
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        for binary in (False, True):
            result = _infer(client, x, binary)
            np.testing.assert_array_equal(result.as_numpy("y"), x * 2 + 1)
            assert ("parameters" in result.get_output("y")) == binary
        # no outputs named: tritonclient asks for all of them as binary (binary_data_output)
        import tritonclient.http as httpclient

        inp = httpclient.InferInput("x", [1, 4], "FP32").set_data_from_numpy(np.ones((1, 4), np.float32))
        np.testing.assert_array_equal(client.infer(MODEL, [inp], model_version="1").as_numpy("y"), np.full((1, 4), 3))
    finally:
        client.close()


def test_concurrent_infers_get_their_own_rows(server):
    url, _, _ = server
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1 + i % 5, 4)).astype(np.float32) for i in range(24)]

    def one(i):
        client = _client(url)
        try:
            return _infer(client, xs[i], binary=i % 2 == 0).as_numpy("y")
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        ys = list(pool.map(one, range(len(xs))))
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, x * 2 + 1)
    client = _client(url)
    try:
        stats = client.get_inference_statistics(MODEL)["model_stats"]
        assert stats[0]["name"] == MODEL and stats[0]["inference_stats"]["success"]["count"] >= len(xs)
        assert any(s["name"] == MODEL for s in client.get_inference_statistics()["model_stats"])
    finally:
        client.close()
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as r:
        text = r.read()
    assert b"kiln_inference_requests_total" in text
    assert b'kiln_event_loop_lag_seconds_count{process="server"}' in text  # watched since the start


def test_repository_index_unload_load(server):
    url, _, _ = server
    client = _client(url)
    try:
        index = client.get_model_repository_index()
        assert [(m["name"], m["state"]) for m in index] == [(MODEL, "READY")]
        client.unload_model(MODEL)
        assert not client.is_model_ready(MODEL)
        assert _request(url, "POST", f"/v2/models/{MODEL}/infer", _json_infer([[1, 2, 3, 4]]))[0] == 400
        client.load_model(MODEL)
        assert client.is_model_ready(MODEL)
        np.testing.assert_array_equal(_infer(client, np.zeros((2, 4), np.float32), True).as_numpy("y"), np.ones((2, 4)))
    finally:
        client.close()


def _json_infer(data, datatype="FP32") -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [len(data), 4], "data": data}]}).encode()


def _request(url, method, path, body=None, headers=None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw and r.getheader("content-type", "").startswith("application/json")
                          else {})
    finally:
        conn.close()


def test_raw_http_errors(server):
    url, _, _ = server
    infer = f"/v2/models/{MODEL}/infer"
    status, doc = _request(url, "POST", infer, b"x" * (LIMIT + 1000))  # refused from Content-Length
    assert status == 413 and str(LIMIT) in doc["error"]

    def chunks():  # no Content-Length: counted while read
        for _ in range(LIMIT // 1000 + 5):
            yield b" " * 1000
    status, doc = _request(url, "POST", infer, chunks())  # http.client sends an iterable chunked
    assert status == 413 and str(LIMIT) in doc["error"]
    status, doc = _request(url, "POST", infer, gzip.compress(b" " * (LIMIT + 1)), {"Content-Encoding": "gzip"})
    assert status == 413

    status, doc = _request(url, "POST", infer, b'{"inputs": [')
    assert status == 400 and "JSON" in doc["error"]
    status, doc = _request(url, "POST", infer, _json_infer([[1, 2, 3, 4]], "INT32"))
    assert status == 400 and "INT32" in doc["error"] and "'x'" in doc["error"]
    status, doc = _request(url, "POST", infer, _json_infer([[1, 2, 3]]))
    assert status == 400 and "'x'" in doc["error"]
    body, n = _binary_request({"x": np.ones((1, 4), np.float32)})
    status, doc = _request(url, "POST", infer, body[:-8], {HEADER_LENGTH: str(n)})  # 8 of the 16 bytes
    assert status == 400 and "binary_data_size" in doc["error"]
    status, doc = _request(url, "POST", infer, body, {HEADER_LENGTH: "-3"})
    assert status == 400 and HEADER_LENGTH in doc["error"]
    status, doc = _request(url, "POST", infer, gzip.compress(_json_infer([[1, 2, 3, 4]])), {"Content-Encoding": "gzip"})
    assert status == 200 and doc["outputs"][0]["data"] == [3, 5, 7, 9]

    status, doc = _request(url, "GET", "/v2/models/nope")
    assert status == 404 and "nope" in doc["error"]
    status, doc = _request(url, "POST", "/v2/models/nope/infer", _json_infer([[1, 2, 3, 4]]))
    assert status == 404
    assert _request(url, "POST", "/v2/models/..%2Fetc/infer", b"{}")[0] == 404  # no route takes a "/" in a name
    for path in ("/v2/models/%2E%2E/config", "/v2/models/a..b/ready", "/v2/models/..%5Cetc/infer"):
        status, doc = _request(url, "POST" if path.endswith("infer") else "GET", path, b"{}")
        assert status == 400 and ".." in doc["error"], (path, status, doc)
    status, doc = _request(url, "POST", "/v2/repository/models/%2E%2E/load", b"{}")
    assert status == 400
    status, doc = _request(url, "GET", "/v2/no/such/route")
    assert status == 404 and "error" in doc
    status, doc = _request(url, "GET", infer)  # the infer route answers POST only
    assert status == 405 and "POST" in doc["error"]
    # system shared memory is off without `kiln serve --shared-memory`
    status, doc = _request(url, "POST", "/v2/systemsharedmemory/region/r/register",
                           b'{"key": "/k", "offset": 0, "byte_size": 16}')
    assert status == 400 and "--shared-memory" in doc["error"]
    shm_input = {"name": "x", "datatype": "FP32", "shape": [1, 4],
                 "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}
    status, doc = _request(url, "POST", infer, json.dumps({"inputs": [shm_input]}).encode())
    assert status == 400 and "--shared-memory" in doc["error"]
    assert "system_shared_memory" not in _request(url, "GET", "/v2")[1]["extensions"]


def test_sigterm_stops_cleanly(server):
    url, proc, log = server
    assert _request(url, "GET", "/v2/health/live")[0] == 200
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, log.read_text()
    assert "stopped" in log.read_text()


def test_serve_command_errors_are_one_line(tmp_path):
    import socket

    from typer.testing import CliRunner

    from kiln.cli.app import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path / "missing")])
    assert result.exit_code != 0 and result.stderr.strip().splitlines() == [
        f"error: model repository {tmp_path / 'missing'} is not a folder"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        empty = tmp_path / "empty"
        empty.mkdir()
        done = subprocess.run([sys.executable, "-m", "kiln", "serve", str(empty), "--http-port", str(port),
                               "--grpc-port", "-1", "--metrics-port", "-1"], capture_output=True, text=True, timeout=60)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith(f"error: cannot listen on 127.0.0.1:{port}"), done.stderr


def _onnx_repository(root: Path) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    _affine_onnx(root / MODEL / "1" / "model.onnx")  # built on load
    return root


def test_json_logs_and_request_logs(tmp_path):
    """--log-format json: every stderr line is one JSON object; --log-requests adds one per inference."""
    root = _onnx_repository(tmp_path / "models")
    with serving(root, "--log-format", "json", "--log-requests", grpc=False) as (url, _, proc, log):
        client = _client(url)
        try:
            _infer(client, np.ones((2, 4), np.float32), binary=True)
            too_many = _json_infer([[1, 2, 3, 4]] * 65)  # past max_batch_size 64: refused by the model itself
            assert _request(url, "POST", f"/v2/models/{MODEL}/infer", too_many)[0] == 400
        finally:
            client.close()
        stop(proc)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records
    events = [r.get("event") for r in records]
    assert "model_state" in events and events[-1] == "stopped"
    listening = [r for r in records if r.get("event") == "listening"]
    assert listening and listening[0]["protocol"] == "HTTP" and url.endswith(f":{listening[0]['port']}")
    done = [r for r in records if r.get("event") == "inference"]
    assert [(r["model"], r["status"]) for r in done] == [(MODEL, "success"), (MODEL, "BadRequest")], done
    assert all(r["ms"] > 0 for r in done)


def test_text_logs_stay_as_they_were_and_log_format_is_checked(tmp_path):
    """Also on Python's own event loop (--loop asyncio; the other tests take uvloop when installed)."""
    root = _onnx_repository(tmp_path / "models")
    with serving(root, "--loop", "asyncio", grpc=False) as (url, _, proc, log):
        client = _client(url)
        try:
            np.testing.assert_array_equal(_infer(client, np.ones((2, 4), np.float32), True).as_numpy("y"),
                                          np.full((2, 4), 3))
        finally:
            client.close()
        stop(proc)
    lines = log.read_text().splitlines()
    assert f"kiln serve: HTTP on http://{url}" in lines and lines[-1] == "kiln serve: stopped", lines
    assert not any("success in" in line for line in lines)
    for flag, value in (("--log-format", "xml"), ("--loop", "trio")):
        bad = subprocess.run([sys.executable, "-m", "kiln", "serve", str(root), flag, value],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and f"{flag} '{value}'" in bad.stderr and "Traceback" not in bad.stderr


def test_serve_help_explains_every_config_field():
    """`kiln serve --help` names every key config.toml accepts (config.py's readers), so none goes undocumented."""
    import dataclasses
    import inspect as pyinspect

    from typer.testing import CliRunner

    from kiln.cli.app import app
    from kiln.serve import config

    text = " ".join(CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output.split())
    source = pyinspect.getsource(config)
    keys = set(re.findall(r'raw\.get\("(\w+)"', source)) | set(re.findall(r'"(\w+)" in raw', source))
    keys |= {f.name for cls in (config.DynamicBatching, config.Padding) for f in dataclasses.fields(cls)}
    keys |= {"name", "max_batch_size", "input", "output", "instance_count", "instance_group", "precision", "profiles",
             "version_policy", "preferred_batch_size", "max_queue_delay_microseconds", "max_queue_size",
             "reject_status", "default_timeout_microseconds", "batch_buckets", "warmup", "padding", "axis", "inputs",
             "outputs", "length_multiple", "data_type", "dims", "latest", "num_versions", "specific", "versions"}
    missing = sorted(k for k in keys if k not in text)
    assert not missing, missing
