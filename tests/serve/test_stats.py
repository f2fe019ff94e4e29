"""Triton's per-stage statistics (queue, compute_input / infer / output, success) from a real `kiln serve` process,
over gRPC and HTTP (JSON and binary tensors), and the matching Prometheus histograms."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from test_http import _affine_onnx, serving

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")

MODEL = "affine"
DELAY_US = 1000  # the queue delay: a lone request waits about this long in the queue
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import kiln

    root = tmp_path_factory.mktemp("stats") / "repo"
    (root / MODEL / "1").mkdir(parents=True)
    engine = kiln.build(str(_affine_onnx(root.parent / "affine.onnx")),
                        kiln.BuildConfig(device="cpu", profiles=({"x": ((1, 4), (4, 4), (64, 4))},)))
    engine.save(str(root / MODEL / "1" / "model.plan"))
    (root / MODEL / "config.toml").write_text(f"[dynamic_batching]\nmax_queue_delay_microseconds = {DELAY_US}\n")
    with serving(root, timeout_s=90) as (url, grpc_url, _, _):
        yield url, grpc_url


def _ints(d: dict) -> dict:
    """A statistics entry with every count and ns as an int (gRPC's JSON gives 64-bit integers as strings)."""
    return {"inference": {k: {f: int(v.get(f, 0)) for f in ("count", "ns")} for k, v in d["inference_stats"].items()},
            "batches": {int(b["batch_size"]): {k: {f: int(b[k].get(f, 0)) for f in ("count", "ns")} for k in STAGES[1:]}
                        for b in d.get("batch_stats", [])},
            "execution_count": int(d.get("execution_count", 0))}


def _grpc_stats(grpc_url: str) -> dict:
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        return _ints(client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0])
    finally:
        client.close()


def _http_stats(url: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/models/{MODEL}/stats", timeout=10) as r:
        return _ints(json.loads(r.read())["model_stats"][0])


def _delta(before: dict, after: dict) -> dict:
    d = {k: {f: after["inference"][k][f] - before["inference"][k][f] for f in ("count", "ns")}
         for k in after["inference"]}
    one = lambda s: s["batches"].get(1, {k: {"count": 0, "ns": 0} for k in STAGES[1:]})  # noqa: E731
    d["batch1"] = {k: {f: one(after)[k][f] - one(before)[k][f] for f in ("count", "ns")} for k in STAGES[1:]}
    return d


def _check_one_request(d: dict) -> None:
    """One successful batch-1 request: every stage counted once, non-zero, inside its success time."""
    assert d["success"]["count"] == 1 and d["fail"]["count"] == 0, d
    for stage in STAGES:
        assert d[stage]["count"] == 1 and d[stage]["ns"] > 0, (stage, d)
    assert d["success"]["ns"] >= sum(d[s]["ns"] for s in STAGES), d
    assert d["queue"]["ns"] >= DELAY_US * 1000 // 2, d  # the batcher waited for company
    for stage in STAGES[1:]:
        assert d["batch1"][stage]["count"] == 1 and d["batch1"][stage]["ns"] > 0, (stage, d)
    # the request's engine time is its batch's; its input and output stages hold the batch's and its own work
    assert d["compute_infer"]["ns"] == d["batch1"]["compute_infer"]["ns"]
    for stage in ("compute_input", "compute_output"):
        assert d[stage]["ns"] > d["batch1"][stage]["ns"], (stage, d)


def test_grpc_request_stages(server):
    _, grpc_url = server
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        inp = grpcclient.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        client.infer(MODEL, [inp])  # warm
        for _ in range(3):
            before = _grpc_stats(grpc_url)
            np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("y"), x * 2 + 1)
            _check_one_request(_delta(before, _grpc_stats(grpc_url)))
    finally:
        client.close()


@pytest.mark.parametrize("binary", [False, True])
def test_http_request_stages(server, binary):
    url, _ = server
    client = httpclient.InferenceServerClient(url)
    try:
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        inp = httpclient.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("y", binary_data=binary)
        for _ in range(3):
            before = _http_stats(url)
            np.testing.assert_array_equal(client.infer(MODEL, [inp], outputs=[out]).as_numpy("y"), x * 2 + 1)
            _check_one_request(_delta(before, _http_stats(url)))
    finally:
        client.close()


def test_failed_request_counts_no_stage(server):
    url, grpc_url = server
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        inp = grpcclient.InferInput("x", [1, 5], "FP32")
        inp.set_data_from_numpy(np.ones((1, 5), np.float32))
        before = _grpc_stats(grpc_url)
        with pytest.raises(Exception, match="shape"):
            client.infer(MODEL, [inp])
        d = _delta(before, _grpc_stats(grpc_url))
    finally:
        client.close()
    assert d["fail"]["count"] == 1 and d["success"]["count"] == 0, d
    assert all(d[s]["count"] == 0 for s in STAGES), d
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    for name in ("kiln_inference_request_seconds", "kiln_inference_compute_input_seconds",
                 "kiln_inference_compute_output_seconds"):
        assert f'{name}_count{{model="{MODEL}"}}' in text, name


def test_concurrent_requests_stay_consistent(server):
    """Merged requests: each counts its batch's engine time, and the stage counts follow the successes."""
    from concurrent.futures import ThreadPoolExecutor

    _, grpc_url = server
    before = _grpc_stats(grpc_url)

    def one(i: int) -> None:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            inp = grpcclient.InferInput("x", [1, 4], "FP32")
            inp.set_data_from_numpy(np.full((1, 4), i, np.float32))
            np.testing.assert_array_equal(client.infer(MODEL, [inp]).as_numpy("y"), np.full((1, 4), 2 * i + 1))
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(16)))
    after = _grpc_stats(grpc_url)
    d = _delta(before, after)
    assert d["success"]["count"] == 16
    assert all(d[s]["count"] == 16 and d[s]["ns"] > 0 for s in STAGES), d
    assert d["success"]["ns"] >= sum(d[s]["ns"] for s in STAGES), d
    batches = after["execution_count"] - before["execution_count"]
    grown = sum(after["batches"][n]["compute_infer"]["count"] - before["batches"].get(n, {}).get(
        "compute_infer", {"count": 0})["count"] for n in after["batches"])
    assert grown == batches
