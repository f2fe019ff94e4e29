"""Scale-out with Ray Serve (kiln.serve.ray_app): the option checks and `kiln serve --ray`'s errors without Ray, then a
local Ray cluster (2 CPUs, no dashboard) running two CPU replicas of a small repository behind Ray's HTTP proxy on
127.0.0.1, driven by tritonclient.http: outputs equal to the engines run directly, and both replicas answering.

The cluster tests skip when Ray Serve is not installed (`pip install 'ray[serve]'`)."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kiln.errors import ConfigError
from kiln.serve.ray_app import REPLICA_HEADER, deployment_options

RAY_MISSING = "Ray Serve is not installed (pip install 'ray[serve]')"
PROFILES = {"affine": {"x": ((1, 4), (8, 4), (16, 4))}, "softmax": {"logits": ((1, 3), (8, 3), (16, 3))}}
INPUT = {"affine": "x", "softmax": "logits"}
OUTPUT = {"affine": "y", "softmax": "probs"}
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def _have_ray() -> bool:
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        return False
    return True


needs_ray = pytest.mark.skipif(not _have_ray(), reason=RAY_MISSING)


# ---------------------------------------------------------------- without a cluster


def test_deployment_options():
    opts = deployment_options("cpu", num_replicas=2, num_cpus=0.5)
    assert opts["num_replicas"] == 2 and opts["ray_actor_options"] == {"num_cpus": 0.5}
    assert "autoscaling_config" not in opts
    opts = deployment_options("cuda", min_replicas=1, max_replicas=4, target_ongoing_requests=3)
    assert opts["ray_actor_options"]["num_gpus"] == 1 and "num_replicas" not in opts
    assert opts["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                          "target_ongoing_requests": 3}
    # a share of a GPU per replica: several replicas (processes) on one GPU; ignored on the CPU
    assert deployment_options("cuda", num_replicas=4, num_gpus=0.25)["ray_actor_options"]["num_gpus"] == 0.25
    assert "num_gpus" not in deployment_options("cpu", num_gpus=0.25)["ray_actor_options"]
    for bad in ({"num_replicas": 2, "max_replicas": 3}, {"num_replicas": 0}, {"min_replicas": 3, "max_replicas": 2},
                {"max_replicas": 0}, {"min_replicas": 1}, {"num_gpus": 0}, {"num_gpus": 1.5}):
        with pytest.raises(ConfigError):
            deployment_options("cpu", **bad)


def _cli(*args: str):
    from typer.testing import CliRunner

    from kiln.cli.app import app

    return CliRunner().invoke(app, ["serve", *args])


def test_cli_ray_flag_errors_are_one_line(tmp_path, monkeypatch):
    for args, message in ((["--replicas", "2"], "--replicas needs --ray"),
                          (["--ray-address", "auto"], "--ray-address needs --ray"),
                          (["--ray", "--replicas", "2", "--autoscale", "1:3"], "give --replicas or --autoscale"),
                          (["--ray", "--autoscale", "3"], "--autoscale '3' is not MIN:MAX"),
                          (["--ray", "--autoscale", "4:2"], "need MIN <= MAX"),
                          (["--ray", "--http-port", "-1"], "HTTP only"),
                          (["--gpus-per-replica", "0.5"], "--gpus-per-replica needs --ray"),
                          (["--ray", "--gpus-per-replica", "2"], "num_gpus per replica must be in (0, 1]")):
        result = _cli(str(tmp_path), *args)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
            args, result.stderr)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed: `import ray` raises ImportError
    result = _cli(str(tmp_path), "--ray")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code != 0 and len(lines) == 1 and "pip install 'ray[serve]'" in lines[0], result.stderr


def test_importing_kiln_serve_imports_no_ray():
    code = ("import sys, kiln.serve, kiln.serve.ray_app, kiln.cli.serve; "
            "from kiln.serve import ModelRepository; assert 'ray' not in sys.modules, 'ray imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- a local Ray cluster


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """examples/make_repository.py's repository (affine with dynamic batching, softmax), each model's plan built on
    the CPU beforehand; returns (root, {model: the engine loaded from its plan})."""
    import kiln
    from examples.make_repository import make_repository

    root = make_repository(tmp_path_factory.mktemp("ray") / "models")
    engines = {}
    for model, profile in PROFILES.items():
        folder = root / model / "1"
        kiln.build(str(folder / "model.onnx"), kiln.BuildConfig(device="cpu", profiles=(profile,))).save(
            str(folder / "model.plan"))
        engines[model] = kiln.load(str(folder / "model.plan"))
    return root, engines


def _direct(engine, name: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(engine.create_context().run({INPUT[name]: x})[OUTPUT[name]])


@needs_ray
def test_cli_ray_serves_until_sigterm(repository):
    """`kiln serve --ray` end to end, in its own process and local Ray cluster: ready, one infer, SIGTERM → exit 0."""
    import tritonclient.http as httpclient

    root, engines = repository
    log = root.parent / "serve-ray.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kiln", "serve", str(root), "--ray", "--replicas", "1",
                                 "--http-port", "0", "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=err,
                                env=ENV)
    try:
        deadline, url = time.monotonic() + 60, None
        while url is None and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            m = re.search(r"HTTP on http://(\S+)", log.read_text())
            url = m and m.group(1)
            time.sleep(0.2)
        assert url is not None, log.read_text()
        client = httpclient.InferenceServerClient(url)
        try:
            assert client.is_server_ready() and client.is_model_ready("affine")
            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            inp = httpclient.InferInput("x", [2, 4], "FP32").set_data_from_numpy(x)
            np.testing.assert_array_equal(client.infer("affine", [inp]).as_numpy("y"), _direct(engines["affine"],
                                                                                                 "affine", x))
        finally:
            client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0, log.read_text()
        assert log.read_text().rstrip().endswith("kiln serve: stopped"), log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_ray
def test_app_builder_for_rays_serve_run(repository):
    """`serve run kiln.serve.ray_app:app_builder repository=... num_replicas=2` hands the builder strings."""
    from kiln.serve.ray_app import app_builder

    root, _ = repository
    app = app_builder({"repository": str(root), "num_replicas": "2", "device": "cpu", "num_cpus": "0.5",
                       "num_gpus": "0.5"})
    assert type(app).__name__ == "Application"
    for args, message in (({"num_replicas": "2"}, "needs repository="),
                          ({"repository": str(root), "replicas": "2"}, "unknown app_builder argument 'replicas'"),
                          ({"repository": str(root), "num_replicas": "two"}, "num_replicas='two' is not an integer"),
                          ({"repository": str(root / "nope")}, "is not a folder"),
                          ({"repository": str(root), "device": "tpu"}, "device 'tpu'")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            app_builder(args)


@pytest.fixture(scope="module")
def cluster(repository):
    """A local Ray cluster of 2 CPUs with two replicas of `repository` behind Ray's proxy on 127.0.0.1; yields its
    host:port. Ray Serve and Ray are shut down afterwards."""
    if not _have_ray():
        pytest.skip(RAY_MISSING)
    import ray
    from ray import serve

    from kiln.serve import ray_app

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    try:
        serving = ray_app.start(repository[0], host="127.0.0.1", port=0, device="cpu", num_replicas=2,
                                num_cpus=1)
        assert [(m["name"], m["state"]) for m in serving.index] == [("affine", "READY"), ("softmax", "READY")]
        yield serving.url
        serving.stop()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _post_infer(url: str, name: str, x: np.ndarray) -> tuple[np.ndarray, str]:
    """One infer built and read by tritonclient.http, sent over http.client to see the Kiln-Replica header:
    (the output, the replica that answered)."""
    import tritonclient.http as httpclient

    inp = httpclient.InferInput(INPUT[name], list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    out = httpclient.InferRequestedOutput(OUTPUT[name], binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([inp], outputs=[out])
    conn = http.client.HTTPConnection(url, timeout=30)
    try:
        conn.request("POST", f"/v2/models/{name}/infer", body=body,
                     headers={"Inference-Header-Content-Length": str(header_length)})
        r = conn.getresponse()
        raw = r.read()
        assert r.status == 200, raw[:500]
        n = r.getheader("Inference-Header-Content-Length")
        result = httpclient.InferResult.from_response_body(raw, header_length=int(n) if n else None)
        return result.as_numpy(OUTPUT[name]), r.getheader(REPLICA_HEADER)
    finally:
        conn.close()


@needs_ray
def test_ray_tritonclient_metadata_and_infer(cluster, repository):
    import tritonclient.http as httpclient

    _, engines = repository
    client = httpclient.InferenceServerClient(cluster)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("affine") and client.is_model_ready("softmax")
        assert client.get_server_metadata()["name"] == "kiln"
        md = client.get_model_metadata("affine")
        assert md["name"] == "affine" and md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
        assert client.get_model_metadata("softmax")["outputs"][0]["name"] == "probs"
        assert client.get_model_config("affine")["max_batch_size"] == 16
        rng = np.random.default_rng(0)
        for name, cols in (("affine", 4), ("softmax", 3)):
            x = rng.standard_normal((3, cols)).astype(np.float32)
            for binary in (False, True):
                inp = httpclient.InferInput(INPUT[name], list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=binary)
                out = httpclient.InferRequestedOutput(OUTPUT[name], binary_data=binary)
                y = client.infer(name, [inp], outputs=[out]).as_numpy(OUTPUT[name])
                np.testing.assert_array_equal(y, _direct(engines[name], name, x))
        with pytest.raises(Exception, match="nope"):
            client.get_model_metadata("nope")
    finally:
        client.close()


@needs_ray
def test_ray_concurrent_requests_reach_both_replicas(cluster, repository):
    _, engines = repository
    rng = np.random.default_rng(1)
    jobs = [("affine" if i % 3 else "softmax", rng.standard_normal((1 + i % 4, 4 if i % 3 else 3)).astype(np.float32))
            for i in range(32)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: _post_infer(cluster, *job), jobs))
    for (name, x), (y, _) in zip(jobs, answers):
        np.testing.assert_array_equal(y, _direct(engines[name], name, x))
    replicas = {r for _, r in answers}
    assert None not in replicas and len(replicas) == 2, replicas
