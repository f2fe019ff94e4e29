"""`kiln serve --workers N`: N processes share the HTTP socket and the gRPC port; each serves every model."""

from __future__ import annotations

import json
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

from kiln.serve.metrics import STATS_REFRESH_S, SharedStatistics, read_snapshots, sum_statistics


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


def _http_stats(url: str, path: str) -> dict:
    with urllib.request.urlopen(f"http://{url}{path}", timeout=5) as r:  # a new connection each time
        return next(e for e in json.loads(r.read())["model_stats"] if e["name"] == MODEL)


def _assert_summed(stats: dict, requests: int, rows: int) -> None:
    """`stats` (HTTP's JSON or gRPC's as JSON) counts every worker's `requests` of `rows` rows each."""
    assert int(stats["inference_count"]) == requests * rows, stats
    assert int(stats["inference_stats"]["success"]["count"]) == requests, stats
    batches = sum(int(b["compute_infer"]["count"]) for b in stats["batch_stats"])
    assert batches == int(stats["execution_count"]) > 0, stats


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return affine_repository(tmp_path_factory.mktemp("workers") / "models")


def test_two_workers_answer_http_and_grpc_and_share_the_connections(repo, tmp_path, monkeypatch):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics = probe.getsockname()[1]
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the workers' shared folder, kiln-serve-metrics-*, made in it
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
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
            lags = set(re.findall(r'kiln_event_loop_lag_seconds_count\{process="(worker \d)"\}', r.read().decode()))
        assert lags == {"worker 0", "worker 1"}  # each worker's loop, by its own label
        time.sleep(3 * STATS_REFRESH_S)  # every worker has published its statistics since
        [shared] = tmp_path.glob("kiln-serve-metrics-*")
        own = [int(e["inference_stats"]["success"]["count"]) for [e] in read_snapshots(shared)]
        assert len(own) == 2 and sum(own) == 32 and 0 not in own, own  # both workers took requests, only they
        for _ in range(8):  # whichever worker answers, over new connections: every worker's sum
            _assert_summed(_http_stats(url, f"/v2/models/{MODEL}/stats"), 32, 2)
            _assert_summed(_http_stats(url, "/v2/models/stats"), 32, 2)
            client = grpcclient.InferenceServerClient(grpc_url)
            _assert_summed(client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0], 32, 2)
            client.close()
        with pytest.raises(InferenceServerException, match="--workers 1"):
            httpclient.InferenceServerClient(url).unload_model(MODEL)
        with pytest.raises(InferenceServerException, match="--workers 1"):
            grpcclient.InferenceServerClient(grpc_url).load_model(MODEL)
    assert proc.returncode == 0, log.read_text()[-4000:]  # 134: a worker aborted (SIGABRT) on the way out
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


def _entry(count: int, ns: int, batches: dict[int, int], last: int, version: str = "1") -> dict:
    """A hand-made statistics entry: `count` successful requests of `ns` each stage, `batches` {size: executions}."""
    d = {"count": count, "ns": ns}
    return {"name": "m", "version": version, "last_inference": last, "inference_count": count,
            "execution_count": sum(batches.values()),
            "inference_stats": {k: dict(d) for k in ("success", "fail", "queue", "compute_input", "compute_infer",
                                                     "compute_output", "cache_hit", "cache_miss")},
            "batch_stats": [{"batch_size": size, **{k: {"count": n, "ns": ns} for k in
                                                    ("compute_input", "compute_infer", "compute_output")}}
                            for size, n in sorted(batches.items())]}


def test_statistics_sum_over_snapshots_and_skip_a_corrupt_one(tmp_path):
    own, other = _entry(3, 30, {1: 1, 2: 1}, last=100), _entry(5, 50, {2: 2, 4: 1}, last=200)
    [total] = sum_statistics([own], [[other], [_entry(7, 1, {}, 1, version="2")], {"not": "a list"},
                                      [{"name": "m", "version": "1", "inference_count": "x"}]])
    assert total["inference_count"] == 8 and total["execution_count"] == 5 and total["last_inference"] == 200
    assert total["inference_stats"]["success"] == {"count": 8, "ns": 80}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in total["batch_stats"]] == [(1, 1), (2, 3), (4, 1)]
    assert sum_statistics([own], []) == [own]

    mine, theirs = SharedStatistics(str(tmp_path), 0), SharedStatistics(str(tmp_path), 1)
    theirs.publish([other])
    (tmp_path / "stats-2.json").write_text('{"worker": 2, "model_stats": [{"name": "m", "vers')  # partial
    (tmp_path / "stats-3.json").write_bytes(b"\xff\x00")  # corrupt
    mine.publish([own])
    assert mine.combine([own])[0]["inference_count"] == 8  # its own live entry and worker 1's; 2 and 3 skipped
    assert read_snapshots(tmp_path) == [[own], [other]]
    (tmp_path / "stats-0.json").unlink()
    mine.publish([_entry(3, 30, {1: 1, 2: 1}, last=100)])  # unchanged: not written again
    assert not (tmp_path / "stats-0.json").exists()
