"""`kiln serve --workers N`: N processes share the HTTP socket and the gRPC port; each serves every model."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from test_http import MODEL, affine_repository, serving



def _wait_workers(log, what: str, n: int = 2) -> None:
    """Until `n` workers have logged `what` (the server answers as soon as the first one is up)."""
    deadline = time.monotonic() + 60
    while len(re.findall(rf"worker \d: {what}", log.read_text())) < n:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def _requests_counted(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(r'kiln_inference_requests_total\{[^}]*\} (\S+)', text))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return affine_repository(tmp_path_factory.mktemp("workers") / "models")


def test_two_workers_answer_http_and_grpc_and_share_the_connections(repo):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics = probe.getsockname()[1]
    with serving(repo, "--workers", "2", "--metrics-port", str(metrics)) as (url, grpc_url, proc, log):
        _wait_workers(log, "gRPC on")
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        for module, where in ((httpclient, url), (grpcclient, grpc_url)):
            for _ in range(16):  # a new connection each time: the kernel spreads them over the workers
                client = module.InferenceServerClient(where)
                inp = module.InferInput("x", [2, 4], "FP32")
                inp.set_data_from_numpy(x)
                np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("y"), x * 2 + 1)
                client.close()
        assert [_requests_counted(metrics) for _ in range(4)] == [32] * 4  # whichever worker answers: the sum
        seen = set()  # each worker's own statistics, over new gRPC connections (SO_REUSEPORT spreads them)
        for _ in range(24):
            client = grpcclient.InferenceServerClient(grpc_url)
            stats = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
            seen.add(int(stats["inference_stats"]["success"].get("count", 0)))
            client.close()
        assert len(seen) == 2 and sum(seen) == 32 and 0 not in seen, seen  # both workers answered, only they
        with pytest.raises(InferenceServerException, match="--workers 1"):
            httpclient.InferenceServerClient(url).unload_model(MODEL)
        with pytest.raises(InferenceServerException, match="--workers 1"):
            grpcclient.InferenceServerClient(grpc_url).load_model(MODEL)
    assert proc.returncode == 0
    assert len(re.findall(r"worker \d: stopped", log.read_text())) == 2  # SIGTERM reached both and they drained


def test_a_worker_that_dies_stops_the_server(repo):
    with serving(repo, "--workers", "2") as (url, _, proc, log):
        pid = int(re.search(r"pids (\d+)", log.read_text()).group(1))
        subprocess.run(["kill", "-KILL", str(pid)], check=True)
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL
    assert "a worker stopped" in log.read_text()


def test_shared_memory_needs_one_worker(repo):
    r = subprocess.run([sys.executable, "-m", "kiln", "serve", str(repo), "--workers", "2", "--shared-memory"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--shared-memory needs --workers 1" in r.stderr and "Traceback" not in r.stderr


def test_sigint_is_passed_on(repo):
    with serving(repo, "--workers", "2", grpc=False) as (url, _, proc, log):
        _wait_workers(log, "HTTP on")  # a worker still loading its models exits 130 on SIGINT
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
