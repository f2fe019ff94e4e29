"""`kiln loadgen`, overload and disconnects against a real `kiln serve` process (issue 24 parts 4, 5 and 7), serving
the repository examples/make_repository.py writes plus a `slow` model with a small queue."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_http import serving

from kiln.cli.loadgen import check_url, run_load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# the slow model's max_queue_size and max_batch_size: a batch can never fill (the queue holds fewer requests), so each
# waits the whole 400 ms queue delay and an overload finds the queue full however slowly the requests arrive
QUEUE, BATCH = 4, 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("load") / "models"
    done = subprocess.run([sys.executable, str(EXAMPLES / "make_repository.py"), str(root)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "affine, softmax" in done.stdout, done.stderr
    assert not (root / "softmax" / "config.toml").exists() and (root / "affine" / "config.toml").is_file()
    (root / "slow" / "1").mkdir(parents=True)
    shutil.copy(root / "affine" / "1" / "model.onnx", root / "slow" / "1" / "model.onnx")
    (root / "slow" / "config.toml").write_text(
        f"max_batch_size = {BATCH}\n[dynamic_batching]\nmax_queue_delay_microseconds = 400000\n"
        f"max_queue_size = {QUEUE}\n")
    with serving(root) as (url, grpc_url, proc, log):
        yield url, grpc_url, proc, log


def _post(url: str, model: str, x: np.ndarray, timeout: float = 30) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": "x" if model != "softmax" else "logits", "datatype": "FP32",
                                   "shape": list(x.shape), "data": x.ravel().tolist()}]})
    conn = http.client.HTTPConnection(url, timeout=timeout)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def _stats(url: str, model: str) -> dict:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request("GET", f"/v2/models/{model}/stats")
        return json.loads(conn.getresponse().read())["model_stats"][0]["inference_stats"]
    finally:
        conn.close()


def test_example_repository_models_answer(server):
    import tritonclient.http as httpclient

    url = server[0]
    client = httpclient.InferenceServerClient(url)
    try:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        inp = httpclient.InferInput("x", [2, 4], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("affine", [inp]).as_numpy("y"), x * 2 + 1)
        assert client.get_model_config("affine")["max_batch_size"] == 16
        logits = np.array([[0, 1, 2], [5, 5, 5]], np.float32)
        inp = httpclient.InferInput("logits", [2, 3], "FP32")
        inp.set_data_from_numpy(logits)
        e = np.exp(logits - logits.max(1, keepdims=True))
        np.testing.assert_allclose(client.infer("softmax", [inp]).as_numpy("probs"), e / e.sum(1, keepdims=True),
                                   rtol=1e-5)
        assert client.get_model_metadata("softmax")["inputs"] == [{"name": "logits", "datatype": "FP32",
                                                                   "shape": [-1, 3]}]
    finally:
        client.close()


def test_loadgen_cli_json(server):
    from typer.testing import CliRunner

    from kiln.cli.app import app

    url = server[0]
    before = _stats(url, "affine")["success"]["count"]
    r = CliRunner().invoke(app, ["loadgen", url, "affine", "--concurrency", "8", "--requests", "200", "--json",
                                 "--shape", "x:2x4"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["requests"] == d["succeeded"] == 200 and d["failed"] == 0 and d["errors"] == {}
    assert d["concurrency"] == 8 and d["shapes"] == {"x": [2, 4]} and d["throughput_infer_per_s"] > 0
    lat = d["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert _stats(url, "affine")["success"]["count"] == before + 200
    table = CliRunner().invoke(app, ["loadgen", url, "softmax", "-c", "2", "--duration", "0.3"])
    assert table.exit_code == 0 and "infer/s" in table.stdout and "p99" in table.stdout, table.output


def test_loadgen_grpc_and_errors(server, tmp_path):
    from typer.testing import CliRunner

    from kiln.cli.app import app

    url, grpc_url = server[:2]
    x = np.ones((3, 4), np.float32)
    report = run_load(grpc_url, "affine", {"x": x}, protocol="grpc", concurrency=4, requests=40)
    assert report["succeeded"] == 40 and report["latency_ms"]["p50"] > 0
    bad = run_load(url, "affine", {"x": np.ones((1, 3), np.float32)}, concurrency=2, requests=6)  # wrong shape: 400
    assert bad["succeeded"] == 0 and bad["errors"] == {"400": 6} and bad["latency_ms"]["p50"] is None
    for target, protocol in ((url, "http"), (grpc_url, "grpc")):  # --output: only the named outputs asked for
        assert run_load(target, "affine", {"x": x}, protocol=protocol, requests=5, outputs=["y"])["succeeded"] == 5
        unknown = run_load(target, "affine", {"x": x}, protocol=protocol, requests=3, outputs=["nope"])
        assert unknown["succeeded"] == 0 and "nope" in next(iter(unknown["error_examples"].values()))
    np.save(tmp_path / "x.npy", x)
    runner = CliRunner()
    r = runner.invoke(app, ["loadgen", f"http://{url}", "affine", "-n", "5", "--input", f"x={tmp_path / 'x.npy'}",
                            "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["shapes"] == {"x": [3, 4]}, r.output
    for args, words in [(["10.1.2.3:8000", "m", "-n", "1"], ["not a loopback", "--allow-remote"]),
                        (["example.com:8000", "m", "-n", "1"], ["--allow-remote"]),
                        ([url, "affine"], ["--requests", "--duration"]),
                        ([url, "affine", "-n", "1", "-d", "1"], ["exactly one"]),
                        ([url, "nope", "-n", "1"], ["nope"]),
                        ([url, "affine", "-n", "1", "--shape", "z:1x4"], ["z"]),
                        ([url, "affine", "-n", "1", "--protocol", "udp"], ["--protocol"])]:
        r = runner.invoke(app, ["loadgen", *args])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error: "), (args, r.output)
        assert all(w in lines[0] for w in words), (args, lines)
    for args in (["-c", "1025"], ["-n", str(10**6 + 1)], ["-d", "3601"]):
        assert runner.invoke(app, ["loadgen", url, "affine", *args]).exit_code == 2  # out of range
    assert check_url("[::1]:8001", False) == "[::1]:8001" and check_url("localhost:1", False) == "localhost:1"
    assert check_url("10.1.2.3:8000", True) == "10.1.2.3:8000"


def test_overload_every_request_gets_one_answer(server):
    url = server[0]
    n = 2 * (QUEUE + BATCH) * 2  # twice more than queue + batch capacity
    before = _stats(url, "slow")
    answers: list = [None] * n
    gate = threading.Barrier(n)

    def one(i):
        x = np.full((1, 4), i, np.float32)
        gate.wait()
        try:
            answers[i] = _post(url, "slow", x)
        except Exception as e:  # noqa: BLE001 (recorded: the test fails on any)
            answers[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ok = rejected = 0
    for i, a in enumerate(answers):
        assert isinstance(a, tuple), a
        status, doc = a
        if status == 200:
            assert doc["outputs"][0]["data"] == [2 * i + 1] * 4
            ok += 1
        else:
            assert status in (503, 429) and "queue is full" in doc["error"], a
            rejected += 1
    assert ok >= 1 and rejected >= 1 and ok + rejected == n
    after = _stats(url, "slow")
    assert after["success"]["count"] - before["success"]["count"] == ok
    assert after["fail"]["count"] - before["fail"]["count"] == rejected
    conn = http.client.HTTPConnection(url, timeout=10)
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200
    conn.close()
    status, doc = _post(url, "slow", np.zeros((1, 4), np.float32))
    assert status == 200 and doc["outputs"][0]["data"] == [1, 1, 1, 1]


def _raw(url: str, body: bytes, send: int) -> socket.socket:
    host, port = url.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    head = (f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: {url}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    s.sendall(head + body[:send])
    return s


def test_disconnected_clients_leave_the_server_and_statistics_sound(server):
    url, _, proc, log = server
    before = _stats(url, "slow")
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()
    whole = [_raw(url, body, len(body)) for _ in range(3)]  # sent whole: accepted, queued for 0.4 s
    half = _raw(url, body, len(body) // 2)  # never complete: never reaches the model
    time.sleep(0.1)
    for s in [*whole, half]:
        s.close()  # gone before the answer
    status, doc = _post(url, "slow", np.ones((1, 4), np.float32))
    assert status == 200 and doc["outputs"][0]["data"] == [3, 3, 3, 3]
    accepted = 3 + 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = _stats(url, "slow")
        if sum(after[k]["count"] - before[k]["count"] for k in ("success", "fail")) >= accepted:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    after = _stats(url, "slow")
    done = {k: after[k]["count"] - before[k]["count"] for k in ("success", "fail")}
    assert done["success"] + done["fail"] == accepted, done
    assert done["success"] >= 1
    assert proc.poll() is None, log.read_text()
    assert "Traceback" not in log.read_text() and "failed" not in log.read_text()  # a client gone is no kiln error
    conn = http.client.HTTPConnection(url, timeout=10)
    conn.request("GET", "/v2/health/live")
    assert conn.getresponse().status == 200
    conn.close()


def test_a_client_that_disconnects_drops_its_queued_request(server):
    """Requests still queued when their HTTP client goes are cancelled, never run (as over gRPC)."""
    url = server[0]

    def counts() -> tuple[int, int, int]:
        conn = http.client.HTTPConnection(url, timeout=10)
        try:
            conn.request("GET", "/v2/models/slow/stats")
            m = json.loads(conn.getresponse().read())["model_stats"][0]
        finally:
            conn.close()
        return m["inference_count"], m["inference_stats"]["success"]["count"], m["inference_stats"]["fail"]["count"]

    before = counts()
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()
    gone = [_raw(url, body, len(body)) for _ in range(3)]  # 3 rows of 4: queued up to the 0.4 s delay
    time.sleep(0.1)
    for s in gone:
        s.close()
    time.sleep(0.2)  # still inside the delay: the disconnects cancel them there
    status, _ = _post(url, "slow", np.ones((1, 4), np.float32))
    assert status == 200
    after = counts()
    rows, ok, failed = (a - b for a, b in zip(after, before))
    assert (rows, ok, failed) == (1, 1, 3), (rows, ok, failed)
