"""kiln.serve's core on the CPU: repository, config, inference, dynamic batching, limits, metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.serve import (BadRequest, ModelConfig, ModelNotFound, ModelNotReady, ModelRepository, QueueFull,
                        RequestTimeout)
from kiln.serve.errors import ModelLoadError

PROFILE = ({"x": ((1, 4), (4, 4), (64, 4))},)


def affine_model():
    """y = x * 2 + 1 over x: float32[N, 4]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    consts = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("one", TensorProto.FLOAT,
                                                                                            [], [1.0])]
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "affine", [x], [y], consts),
                             opset_imports=[helper.make_opsetid("", 17)])


def two_io_model():
    """s = a + b, d = a - b over float32[N, 3] (dims of the second axis dynamic too: D)."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", "D"]) for n in ("a", "b")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", "D"]) for n in ("s", "d")]
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Sub", ["a", "b"], ["d"])]
    return helper.make_model(helper.make_graph(nodes, "two", ins, outs), opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    (root / "affine" / "1").mkdir(parents=True)
    kiln.build(affine_model(), kiln.BuildConfig(device="cpu", profiles=PROFILE)).save(root / "affine" / "1" /
                                                                                      "model.plan")
    (root / "affine" / "config.toml").write_text(
        'max_batch_size = 64\n[dynamic_batching]\nmax_queue_delay_microseconds = 20000\n')
    (root / "onnxy" / "2").mkdir(parents=True)
    (root / "onnxy" / "2" / "model.onnx").write_bytes(two_io_model().SerializeToString())
    (root / "onnxy" / "config.toml").write_text(
        'max_batch_size = 8\n[[profiles]]\na = {min = [1, 1], opt = [2, 3], max = [8, 5]}\n'
        'b = {min = [1, 1], opt = [2, 3], max = [8, 5]}\n[dynamic_batching]\nmax_queue_delay_microseconds = 20000\n')
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.plan").write_bytes(b"not a plan")
    return root


@pytest.fixture()
def repo(repo_root) -> ModelRepository:
    r = ModelRepository(repo_root, device="cpu")
    r.start()
    return r


def test_repository_index_and_failing_model(repo, repo_root):
    index = {m["name"]: m for m in repo.index()}
    assert index["affine"]["state"] == "READY" and index["affine"]["version"] == "1"
    assert index["onnxy"]["state"] == "READY" and index["onnxy"]["version"] == "2"
    assert index["broken"]["state"] == "UNAVAILABLE" and index["broken"]["reason"]
    assert (repo_root / "onnxy" / "2" / "model.plan").is_file()  # the built onnx is cached
    assert repo.ready() and repo.names() == ["affine", "broken", "onnxy"]
    with pytest.raises(ModelNotReady):
        repo.get("broken")
    with pytest.raises(ModelLoadError, match="broken"):
        repo.load("broken")
    assert asyncio.run(repo.get("affine").infer({"x": np.zeros((1, 4), np.float32)}))["y"].tolist() == [[1.0] * 4]


def test_load_unload_get(repo):
    assert repo.get("affine", "1").version == "1"
    with pytest.raises(ModelNotFound):
        repo.get("affine", "7")
    with pytest.raises(ModelNotFound):
        repo.get("nope")
    repo.unload("affine")
    with pytest.raises(ModelNotReady):
        repo.get("affine")
    assert {m["name"]: m["state"] for m in repo.index()}["affine"] == "UNAVAILABLE"
    repo.load("affine")
    assert repo.get("affine").name == "affine"


@pytest.mark.parametrize("name", ["..", "/etc", "a/../b", "a\\b", "x\0", ""])
def test_name_validation(repo, name):
    with pytest.raises(BadRequest):
        repo.get(name)
    with pytest.raises(BadRequest):
        repo.load(name)


def test_config_toml_and_auto(repo, repo_root):
    cfg = repo.get("affine").config
    assert cfg.max_batch_size == 64 and cfg.dynamic_batching.max_queue_delay_microseconds == 20000
    j = cfg.to_json()
    assert j["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert j["instance_group"][0]["count"] == 1 and j["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
    auto = ModelConfig.auto("affine", kiln.load(repo_root / "affine" / "1" / "model.plan"))
    assert auto.max_batch_size == 64 and [t.dims for t in auto.output] == [[4]]
    assert repo.get("affine").metadata()["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]


def test_auto_complete_without_config(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    kiln.build(affine_model(), kiln.BuildConfig(device="cpu", profiles=PROFILE)).save(tmp_path / "m" / "1" /
                                                                                      "model.plan")
    repo = ModelRepository(tmp_path, device="cpu")
    repo.start()
    cfg = repo.get("m").config
    assert cfg.max_batch_size == 64 and cfg.dynamic_batching is not None
    assert [(t.name, t.data_type, t.dims) for t in cfg.input] == [("x", "FP32", [4])]


def test_infer_exact_and_validation(repo):
    async def main():
        m = repo.get("onnxy")
        a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
        out = await m.infer({"a": a, "b": b})
        np.testing.assert_array_equal(out["s"], a + b)
        np.testing.assert_array_equal(out["d"], a - b)
        assert list(await m.infer({"a": a, "b": b}, requested=["d"])) == ["d"]
        for bad, what in [({"a": a}, "'b'"), ({"a": a, "b": b, "c": a}, "'c'"),
                          ({"a": a.astype(np.float64), "b": b}, "'a'"), ({"a": a[0], "b": b[0]}, "'a'")]:
            with pytest.raises(BadRequest, match=what):
                await m.infer(bad)
        with pytest.raises(BadRequest, match="'zz'"):
            await m.infer({"a": a, "b": b}, requested=["zz"])
        await repo.close()
    asyncio.run(main())


def test_a_batch_copies_out_only_the_outputs_its_requests_asked_for(repo, monkeypatch):
    """Merged requests that ask for "d" alone run a batch that keeps only "d" (a GPU batch downloads only it); one
    request asking for everything makes its batch keep both; each answer is exact and holds what it asked for."""
    from kiln.serve import batcher
    kept = []
    only = batcher._only
    monkeypatch.setattr(batcher, "_only", lambda outputs, wanted: kept.append(wanted) or only(outputs, wanted))

    async def main():
        m = repo.get("onnxy")
        a = [np.full((1, 3), i, np.float32) for i in range(4)]
        b = np.ones((1, 3), np.float32)
        outs = await asyncio.gather(*(m.infer({"a": x, "b": b}, requested=["d"]) for x in a))
        assert [list(o) for o in outs] == [["d"]] * 4
        for x, o in zip(a, outs):
            np.testing.assert_array_equal(o["d"], x - b)
        assert kept and all(w == frozenset({"d"}) for w in kept)
        kept.clear()
        both = await asyncio.gather(m.infer({"a": a[0], "b": b}, requested=["s"]), m.infer({"a": a[1], "b": b}))
        assert list(both[0]) == ["s"] and sorted(both[1]) == ["d", "s"]
        np.testing.assert_array_equal(both[0]["s"], a[0] + b)
        np.testing.assert_array_equal(both[1]["d"], a[1] - b)
        assert None in kept
        assert m.statistics()["execution_count"] < 6  # the requests were merged
        await repo.close()
    asyncio.run(main())


def test_dynamic_batching(repo):
    async def main():
        m = repo.get("affine")
        rows = [np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32) for i in range(16)]
        outs = await asyncio.gather(*(m.infer({"x": r}) for r in rows))
        for r, o in zip(rows, outs):
            np.testing.assert_array_equal(o["y"], r * np.float32(2) + np.float32(1))
        stats = m.statistics()
        assert stats["execution_count"] < 16 and stats["inference_count"] == 16
        assert any(b["batch_size"] > 1 for b in stats["batch_stats"])
        assert stats["inference_stats"]["success"]["count"] == 16
        await repo.close()
    asyncio.run(main())


def test_different_dims_never_merged(repo):
    async def main():
        m = repo.get("onnxy")
        reqs = [np.full((1, 2 + i % 2), i, np.float32) for i in range(8)]
        outs = await asyncio.gather(*(m.infer({"a": r, "b": r}) for r in reqs))
        for r, o in zip(reqs, outs):
            np.testing.assert_array_equal(o["s"], r + r)
        await repo.close()
    asyncio.run(main())


def test_queue_full_and_timeout(repo):
    async def main():
        m = repo.get("affine")
        m.batcher.max_queue_size = 2
        m.batcher.max_queue_delay_s = 0.2
        x = np.ones((1, 4), np.float32)
        first = [asyncio.ensure_future(m.infer({"x": x})) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as e:
            await m.infer({"x": x})
        assert e.value.http_status == 503
        await asyncio.gather(*first)
        with pytest.raises(RequestTimeout):
            await m.infer({"x": x}, timeout_s=0.01)
        await repo.close()
    asyncio.run(main())


def test_metrics_render(repo):
    async def main():
        await repo.get("affine").infer({"x": np.ones((2, 4), np.float32)})
        with pytest.raises(BadRequest):
            await repo.get("affine").infer({"x": np.ones((2, 5), np.float32)})
        await repo.close()
    asyncio.run(main())
    text = repo.metrics.render().decode()
    assert 'kiln_inference_requests_total{model="affine",status="success",version="1"}' in text
    assert 'status="BadRequest"' in text
    for name in ("kiln_inference_batch_size", "kiln_inference_queue_seconds", "kiln_inference_compute_seconds",
                 "kiln_inference_request_seconds", "kiln_inference_compute_input_seconds",
                 "kiln_inference_compute_output_seconds"):
        assert name in text


def test_answered_requests_leave_the_queue_without_printing_their_inputs():
    """Forgetting a request a batch already took must not format it: its repr once printed every input array
    (an image request's 150k values), which cost the server ~10 ms per request."""
    from kiln.serve.batcher import DynamicBatcher, Request, _LoopState

    class NoRepr:
        def __repr__(self):
            raise AssertionError("a request's inputs were formatted")

    async def go():
        state = _LoopState(asyncio.get_running_loop())
        req = Request({"x": NoRepr()}, 1, (), state.loop.create_future())
        state.pending.append(req)
        DynamicBatcher._forget(state, req)
        assert not state.pending
        DynamicBatcher._forget(state, req)  # already gone: nothing to do, nothing formatted
        assert "NoRepr" not in repr(req)
    asyncio.run(go())


def test_a_loaded_model_is_found_without_touching_the_file_system(repo, monkeypatch):
    """Every request looks its model up: a loaded model's name was checked at load, so no path is resolved per
    request (resolving cost a quarter of a tiny model's server time); other names still are checked."""
    def refuse(*a, **k):
        raise AssertionError("a path was resolved")
    monkeypatch.setattr(Path, "resolve", refuse)
    assert repo.get("affine").name == "affine" and repo.get("affine", "1").version == "1"
    monkeypatch.undo()
    with pytest.raises(ModelNotFound):
        repo.get("nope")
    with pytest.raises(BadRequest):
        repo.get("../affine")
