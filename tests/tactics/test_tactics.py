"""Tactic registry and engine plumbing on the CPU: every layer gets the reference, plans record choices;
on a GPU: tuned engines match the reference, capture in a CUDA graph, and reuse the timing cache."""

import numpy as np
import pytest
import torch
from onnx import TensorProto as T, helper, numpy_helper

import kiln
from kiln.builder.autotune import _close
from kiln.tactics.choice import Choice
from kiln.tactics import registry
from kiln.tactics.registry import Tactic

rng = np.random.default_rng(0)


def _model():
    rng = np.random.default_rng(1)  # the same weights on every call: engines built from it must agree
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((8 * 6 * 6, 10)).astype(np.float32), "fc")
    shape = numpy_helper.from_array(np.array([2, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 10])], initializer=[w, fc, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_cpu_engine_uses_reference_and_plan_records_it(tmp_path):
    engine = kiln.build(_model(), kiln.BuildConfig(device="cpu"))
    assert set(engine.tactic_summary()) == {"reference"}
    engine.save(tmp_path / "m.plan")
    loaded = kiln.load(tmp_path / "m.plan")
    assert {c.tactic for c in loaded.tactics.values()} == {"reference"}
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], engine.run({"x": x})["y"])


def test_choice_json_round_trip():
    c = Choice("cudnn_conv", {"layout": "nhwc"}, 3.5, "timed", [("triton_x{}", "failed: out of resources")],
               [("cudnn_conv{'layout': 'nhwc'}", 3.5), ("triton_conv{}", 4.25)])
    assert Choice.from_json(c.to_json()) == c
    assert Choice.from_json({"tactic": "reference"}).timed == []  # plans written before the list existed


def test_correctness_check_rejects_wrong_results():
    want = [torch.ones(4, 4)]
    assert _close([torch.ones(4, 4)], want, tf32=False) is None
    assert "wrong result" in _close([torch.ones(4, 4) * 1.01], want, tf32=False)
    assert "instead of" in _close([torch.ones(4, 4, dtype=torch.float16)], want, tf32=False)


def test_registry_offers_cuda_tactics_only_on_cuda():
    from kiln.target.device import detect
    from kiln.tactics.spec import layer_spec

    engine = kiln.build(_model(), kiln.BuildConfig(device="cpu"))
    conv = next(l for l in engine.network.layers if l.kind in ("Conv", "FusedConv"))
    ok, _ = registry.candidates(layer_spec(engine.network, conv, engine.weights), detect("cpu"))
    assert [t.name for t in ok] == ["reference"]


@pytest.mark.gpu
def test_gpu_engine_matches_reference_captures_graph_and_reuses_cache(tmp_path):
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    want = kiln.build(_model(), kiln.BuildConfig(device="cpu")).run({"x": x})["y"]
    cfg = kiln.BuildConfig(device="cuda", timing_cache=str(tmp_path / "t.db"))
    engine = kiln.build(_model(), cfg)
    assert set(engine.tactic_summary()) != {"reference"}
    ctx = engine.create_context()
    for _ in range(2):
        got = ctx.run({"x": torch.from_numpy(x).cuda()})["y"].cpu().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert ctx.eager_reasons == {}, ctx.eager_reasons
    again = kiln.build(_model(), cfg)
    assert again.build_info["timing_cache"]["hits"] >= 2
    assert {n: c.tactic for n, c in again.tactics.items()} == {n: c.tactic for n, c in engine.tactics.items()}
    engine.save(tmp_path / "m.plan")
    np.testing.assert_allclose(kiln.load(tmp_path / "m.plan").run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_failing_tactic_is_recorded_not_fatal(monkeypatch):
    def boom(spec, config, device):
        raise RuntimeError("out of resources: shared memory")

    bad = Tactic("always_fails", ("MatMul", "FusedGemm"), boom, priority=0)
    monkeypatch.setitem(registry.TACTICS, bad.name, bad)
    for k in bad.kinds:
        monkeypatch.setitem(registry.BY_KIND, k, [bad] + registry.BY_KIND.get(k, []))
    engine = kiln.build(_model(), kiln.BuildConfig(device="cuda"))
    fc = next(c for c in engine.tactics.values() if any(r[0].startswith("always_fails") for r in c.rejected))
    assert fc.tactic != "always_fails" and "out of resources" in dict(fc.rejected)["always_fails"]


@pytest.mark.gpu
def test_gpu_fp16_engine_close_to_fp32():
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    want = kiln.build(_model(), kiln.BuildConfig(device="cpu")).run({"x": x})["y"]
    got = kiln.build(_model(), kiln.BuildConfig(device="cuda", fp16=True)).run({"x": x})["y"]
    cos = (got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)
    assert got.dtype == np.float32 and cos >= 0.999


@pytest.mark.parametrize("kind,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1], ceil_mode=0,
                     auto_pad="NOTSET", storage_order=0)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 1], ceil_mode=1,
                         auto_pad="NOTSET", count_include_pad=0)),
    ("GlobalAveragePool", {}), ("GlobalMaxPool", {})])
def test_torch_pool_tactics_match_reference_on_cpu(kind, attrs):
    """The tactic kernels are plain torch, so their semantics are checked here too (fp32: a few ulps)."""
    from kiln.ir import DType
    from kiln.kinds import run_reference
    from kiln.tactics.spec import LayerSpec, ValueSpec

    x = torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(0))
    want = run_reference(kind, [x], attrs)[0]
    spec = LayerSpec("l", kind, attrs, (ValueSpec(DType.FLOAT32, tuple(x.shape)),),
                     (ValueSpec(DType.FLOAT32, tuple(want.shape)),))
    registry._load()
    tactic = next(t for t in registry.BY_KIND[kind] if t.name.startswith("torch_"))
    assert tactic.supports(spec, None) is None
    torch.testing.assert_close(tactic.compile(spec, {}, None)([x])[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_tactic_timing_counts_device_time_not_host_launch_cost():
    import time

    from kiln.util.timing import device_time_us as _time

    x = torch.ones(1024, device="cuda")

    def slow_host(inputs):  # 100 µs of host work before a microsecond kernel, like a slow Python launcher
        until = time.perf_counter() + 1e-4
        while time.perf_counter() < until:
            pass
        return inputs[0] + 1

    assert _time(slow_host, [x], 5) < 50.0
