"""Model versions (Triton's version_policy): config parsing, which versions the repository loads, and addressing one
version over HTTP (/v2/models/NAME/versions/V/...) and gRPC (model_version) on a real `kiln serve` process.

Version V of model `m` computes y = x * 2 + V, so every answer says which version ran it (exactly: small integers in
float32)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_http import serving

from kiln.errors import ConfigError
from kiln.serve import ModelConfig, ModelNotFound, ModelNotReady, ModelRepository
from kiln.serve.config import VersionPolicy
from kiln.serve.errors import BadRequest, ModelLoadError


def versioned_onnx(version: int) -> bytes:
    """y = x * 2 + version over x: float32[N, 4]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    consts = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
              helper.make_tensor("v", TensorProto.FLOAT, [], [float(version)])]
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "v"], ["y"])]
    graph = helper.make_graph(nodes, f"v{version}", [x], [y], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def make_model(root: Path, name: str, versions=(1, 2, 3), config: str = "") -> Path:
    for v in versions:
        (root / name / str(v)).mkdir(parents=True, exist_ok=True)
        (root / name / str(v) / "model.onnx").write_bytes(versioned_onnx(v))
    (root / name / "config.toml").write_text("max_batch_size = 8\n" + config)
    return root / name


def expected(x: np.ndarray, version: int) -> np.ndarray:
    return x * np.float32(2) + np.float32(version)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("text, policy, selected, as_json", [
    ("", VersionPolicy("latest", 1), [3], {"latest": {"num_versions": 1}}),
    ("[version_policy]\nlatest = {}\n", VersionPolicy("latest", 1), [3], {"latest": {"num_versions": 1}}),
    ("[version_policy]\nlatest = {num_versions = 2}\n", VersionPolicy("latest", 2), [2, 3],
     {"latest": {"num_versions": 2}}),
    ("[version_policy]\nlatest = {num_versions = 9}\n", VersionPolicy("latest", 9), [1, 2, 3],
     {"latest": {"num_versions": 9}}),
    ("[version_policy.all]\n", VersionPolicy("all"), [1, 2, 3], {"all": {}}),
    ("[version_policy]\nspecific = {versions = [3, 1, 1]}\n", VersionPolicy("specific", versions=(1, 3)), [1, 3],
     {"specific": {"versions": [1, 3]}}),
])
def test_policy_parses(tmp_path, text, policy, selected, as_json):
    folder = make_model(tmp_path, "m", config=text)
    cfg = ModelConfig.from_toml(folder / "config.toml", folder)
    assert cfg.version_policy == policy and policy.select([3, 1, 2]) == selected
    assert cfg.to_json()["version_policy"] == as_json


@pytest.mark.parametrize("text, words", [
    ("[version_policy]\nlatest = {}\nall = {}\n", ["version_policy", "exactly one", "all", "latest"]),
    ("[version_policy]\n", ["version_policy", "exactly one"]),
    ("version_policy = 3\n", ["version_policy", "exactly one"]),
    ("[version_policy]\nnewest = {}\n", ["version_policy", "'newest'", "latest, all, specific"]),
    ("[version_policy]\nlatest = {num_versions = 0}\n", ["version_policy.latest.num_versions", ">= 1"]),
    ("[version_policy]\nlatest = {num_versions = -2}\n", ["version_policy.latest.num_versions"]),
    ("[version_policy]\nlatest = {num_versions = \"2\"}\n", ["version_policy.latest.num_versions"]),
    ("[version_policy]\nlatest = {count = 2}\n", ["version_policy.latest", "'count'"]),
    ("[version_policy]\nall = {versions = [1]}\n", ["version_policy.all", "'versions'"]),
    ("[version_policy]\nspecific = {versions = [\"1\"]}\n", ["version_policy.specific.versions", "integers"]),
    ("[version_policy]\nspecific = {versions = [1.5]}\n", ["version_policy.specific.versions", "integers"]),
    ("[version_policy]\nspecific = {versions = []}\n", ["version_policy.specific.versions"]),
    ("[version_policy]\nspecific = {}\n", ["version_policy.specific.versions"]),
    ("[version_policy]\nspecific = {versions = [1, 7]}\n", ["version_policy.specific.versions", "version 7",
                                                             "m/7/"]),
])
def test_bad_policy_is_a_config_error(tmp_path, text, words):
    folder = make_model(tmp_path, "m", config=text)
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_toml(folder / "config.toml", folder)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


# ---------------------------------------------------------------- the repository


def _repo(root: Path) -> ModelRepository:
    repo = ModelRepository(root, device="cpu")
    repo.start()
    return repo


def _run(model, version: int) -> None:
    import asyncio

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(asyncio.run(model.infer({"x": x}))["y"], expected(x, version))


def test_repository_loads_the_selected_versions(tmp_path):
    make_model(tmp_path, "latest")
    make_model(tmp_path, "two", config="[version_policy]\nlatest = {num_versions = 2}\n")
    make_model(tmp_path, "every", config="[version_policy]\nall = {}\n")
    make_model(tmp_path, "some", config="[version_policy]\nspecific = {versions = [1, 3]}\n")
    repo = _repo(tmp_path)
    index = [(m["name"], m["version"], m["state"]) for m in repo.index()]
    assert index == [("every", "1", "READY"), ("every", "2", "READY"), ("every", "3", "READY"),
                     ("latest", "3", "READY"), ("some", "1", "READY"), ("some", "3", "READY"),
                     ("two", "2", "READY"), ("two", "3", "READY")]
    for name, versions in (("latest", [3]), ("two", [2, 3]), ("every", [1, 2, 3]), ("some", [1, 3])):
        assert repo.get(name).version == str(versions[-1])  # no version: the newest loaded
        for v in versions:
            m = repo.get(name, str(v))
            assert m.version == str(v) and m.metadata()["versions"] == [str(v) for v in versions]
            _run(m, v)
        assert [m.version for m in repo.models(name)] == [str(v) for v in versions]
        for v in sorted({1, 2, 3, 9} - set(versions)):  # not selected by the policy, or no such folder
            with pytest.raises(ModelNotFound, match=f"no version {v}"):
                repo.get(name, str(v))
    with pytest.raises(BadRequest, match="'x1'"):
        repo.get("every", "x1")
    assert repo.get("every", "02").version == "2"
    repo.unload("every")
    assert [(m["version"], m["state"], m["reason"]) for m in repo.index() if m["name"] == "every"] == [
        ("1", "UNAVAILABLE", "unloaded"), ("2", "UNAVAILABLE", "unloaded"), ("3", "UNAVAILABLE", "unloaded")]
    with pytest.raises(ModelNotReady, match="version 2"):
        repo.get("every", "2")
    with pytest.raises(ModelNotReady):
        repo.get("every")
    repo.load("every")
    assert [m.version for m in repo.models("every")] == ["1", "2", "3"]
    assert {m.name for m in repo.models()} == {"every", "latest", "two", "some"} and len(repo.models()) == 8


def test_a_failing_version_leaves_the_others_serving(tmp_path):
    make_model(tmp_path, "m", config="[version_policy]\nall = {}\n")
    (tmp_path / "m" / "2" / "model.onnx").unlink()
    (tmp_path / "m" / "2" / "model.plan").write_bytes(b"not a plan")
    repo = ModelRepository(tmp_path, device="cpu")
    with pytest.raises(ModelLoadError, match="version 2"):
        repo.load("m")
    repo.start(load_all=False)
    states = {m["version"]: (m["state"], m["reason"]) for m in repo.index()}
    assert states["1"] == ("READY", "") and states["3"] == ("READY", "")
    assert states["2"][0] == "UNAVAILABLE" and states["2"][1]
    with pytest.raises(ModelNotReady, match="version 2"):
        repo.get("m", "2")
    _run(repo.get("m"), 3)
    _run(repo.get("m", "1"), 1)


def test_a_bad_policy_makes_the_model_unavailable(tmp_path):
    make_model(tmp_path, "m", config="[version_policy]\nspecific = {versions = [4]}\n")
    make_model(tmp_path, "ok")
    repo = _repo(tmp_path)
    index = {m["name"]: m for m in repo.index()}
    assert index["ok"]["state"] == "READY"
    assert index["m"]["state"] == "UNAVAILABLE" and "version_policy.specific.versions" in index["m"]["reason"]
    with pytest.raises(ModelNotReady, match="version_policy"):
        repo.get("m")
    with pytest.raises(ModelNotReady):
        repo.get("m", "3")


# ---------------------------------------------------------------- a real server: HTTP and gRPC


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("versions") / "models"
    make_model(root, "m", config="[version_policy]\nspecific = {versions = [1, 3]}\n"
                                 "[dynamic_batching]\nmax_queue_delay_microseconds = 1000\n")
    with serving(root) as (url, grpc_url, _, log):
        yield url, grpc_url, log


def _request(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(url, timeout=30)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body))
        r = conn.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


def _json_infer(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


def test_http_version_routes(server):
    import tritonclient.http as httpclient

    url, _, log = server
    assert "model m version 1: READY" in log.read_text() and "model m version 3: READY" in log.read_text()
    client = httpclient.InferenceServerClient(url)
    try:
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        for version in ("1", "3", ""):
            inp = httpclient.InferInput("x", [1, 4], "FP32").set_data_from_numpy(x)
            result = client.infer("m", [inp], model_version=version)
            np.testing.assert_array_equal(result.as_numpy("y"), expected(x, int(version or 3)))
            assert result.get_response()["model_version"] == (version or "3")
            assert client.is_model_ready("m", version)
            md = client.get_model_metadata("m", version)
            assert md["versions"] == ["1", "3"] and md["name"] == "m"
            assert client.get_model_config("m", version)["version_policy"] == {"specific": {"versions": [1, 3]}}
        stats = client.get_inference_statistics("m")["model_stats"]  # no version: every loaded one
        assert [(s["name"], s["version"]) for s in stats] == [("m", "1"), ("m", "3")]
        assert [s["inference_stats"]["success"]["count"] for s in stats] == [1, 2]  # "" went to version 3
        assert [s["version"] for s in client.get_inference_statistics("m", "1")["model_stats"]] == ["1"]
        assert [s["version"] for s in client.get_inference_statistics()["model_stats"]] == ["1", "3"]
        assert [(m["name"], m["version"], m["state"]) for m in client.get_model_repository_index()] == [
            ("m", "1", "READY"), ("m", "3", "READY")]
        assert not client.is_model_ready("m", "2") and not client.is_model_ready("m", "9")
    finally:
        client.close()
    for version in ("2", "9"):  # present but not in the policy, and absent: not found, as Triton
        for method, suffix, body in (("GET", "", None), ("GET", "/ready", None), ("GET", "/config", None),
                                     ("GET", "/stats", None), ("POST", "/infer", _json_infer(x))):
            status, doc = _request(url, method, f"/v2/models/m/versions/{version}{suffix}", body)
            assert status == 404 and f"no version {version}" in doc["error"], (version, suffix, status, doc)
    status, doc = _request(url, "POST", "/v2/models/m/versions/one/infer", _json_infer(x))
    assert status == 400 and "'one'" in doc["error"] and "integer" in doc["error"]


def test_grpc_model_version(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    _, grpc_url, _ = server
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        x = np.full((2, 4), 5, np.float32)
        for version in ("1", "3", ""):
            inp = grpcclient.InferInput("x", [2, 4], "FP32")
            inp.set_data_from_numpy(x)
            result = client.infer("m", [inp], model_version=version)
            np.testing.assert_array_equal(result.as_numpy("y"), expected(x, int(version or 3)))
            assert result.get_response().model_version == (version or "3")
            assert client.is_model_ready("m", version)
            assert list(client.get_model_metadata("m", version).versions) == ["1", "3"]
            policy = client.get_model_config("m", version, as_json=True)["config"]["version_policy"]
            assert [int(v) for v in policy["specific"]["versions"]] == [1, 3]
        assert not client.is_model_ready("m", "2")
        inp = grpcclient.InferInput("x", [2, 4], "FP32")
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as e:
            client.infer("m", [inp], model_version="2")
        assert "NOT_FOUND" in str(e.value.status()) and "no version 2" in e.value.message()
        stats = client.get_inference_statistics("m", as_json=True)["model_stats"]
        assert [s["version"] for s in stats] == ["1", "3"]
        index = client.get_model_repository_index(as_json=True)["models"]
        assert [(m["name"], m["version"], m["state"]) for m in index] == [("m", "1", "READY"), ("m", "3", "READY")]
    finally:
        client.close()
