"""Layers with symbolic shapes are checked and timed at the profile's opt shapes, not taken on priority alone.

The autotuner runs on a stand-in CUDA device whose tensors live on the CPU, at opt level 0 (check, no timing),
so that its choice logic is tested without a GPU.
"""

from types import SimpleNamespace

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from kiln.builder.autotune import Autotuner, at_shapes
from kiln.builder.specialize import observe_shapes
from kiln.frontend.onnx import import_onnx, load_onnx
from kiln.frontend.onnx.limits import ModelLimits
from kiln.ir import DType
from kiln.tactics import registry
from kiln.tactics.registry import Tactic
from kiln.tactics.spec import LayerSpec, ValueSpec


class FakeCuda:
    """A CUDA-backend device for the tuner's logic, computing on the CPU."""

    backend, name, torch_device, hardware_compat = "cuda", "stand-in", "cpu", "none"

    def fingerprint(self):
        return {"backend": "cuda", "name": self.name}


W = torch.randn(40, 24, generator=torch.Generator().manual_seed(0))
F32 = DType.FLOAT32


def _specs():
    layer = SimpleNamespace(inputs=["x", "w"], outputs=["y"])
    spec = LayerSpec("mm", "MatMul", {}, (ValueSpec(F32, ("n", 40)), ValueSpec(F32, (40, 24), W)),
                     (ValueSpec(F32, ("n", 24)),))
    return layer, spec


def _tactic(name, fn):
    return Tactic(name, ("MatMul",), lambda spec, config, device: (lambda inputs: [fn(inputs[0], inputs[1])]))


BAD = _tactic("wrong_when_rows_over_4", lambda a, w: (a @ w) * (1 if a.shape[0] <= 4 else 0))
GOOD = _tactic("right", lambda a, w: a @ w)


def test_symbolic_layer_is_checked_at_the_opt_shapes(monkeypatch):
    layer, spec = _specs()
    monkeypatch.setattr(registry, "candidates", lambda s, d: ([BAD, GOOD], []))
    tuner = Autotuner(FakeCuda(), 0, False, None)
    tuning = at_shapes(spec, layer, {"x": (8, 40), "y": (8, 24)})
    assert tuning.static and tuning.inputs[0].shape == (8, 40) and tuning.inputs[1].const is W
    choice = tuner.choose(spec, tuning)
    assert choice.tactic == "right"
    assert any(label.startswith("wrong_when_rows_over_4") and "wrong result" in why for label, why in choice.rejected)


def test_without_opt_shapes_priority_decides(monkeypatch):
    layer, spec = _specs()
    monkeypatch.setattr(registry, "candidates", lambda s, d: ([BAD, GOOD], []))
    choice = Autotuner(FakeCuda(), 0, False, None).choose(spec, None)
    assert (choice.tactic, choice.source) == ("wrong_when_rows_over_4", "heuristic")


def test_at_shapes_needs_every_symbolic_tensor():
    layer, spec = _specs()
    assert at_shapes(spec, layer, {"x": (8, 40)}) is None
    assert at_shapes(spec, layer, None) is None


def test_observe_shapes_at_the_opt_profile():
    """Dynamic batch through Reshape/Transpose: every tensor gets its opt-shape value; the network is unchanged."""
    shape = onnx.numpy_helper.from_array(np.array([0, 4, 6], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Transpose", ["r"], ["y"],
                                                                                   perm=[0, 2, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6, 4])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    net = import_onnx(load_onnx(model.SerializeToString(), ModelLimits()).proto)
    before = {n: t.shape for n, t in net.tensors.items()}
    shapes = observe_shapes(net, "cpu", {"x": (5, 24)})
    assert shapes["x"] == (5, 24) and shapes["y"] == (5, 6, 4)
    assert {n: t.shape for n, t in net.tensors.items()} == before
    assert not net.tensors["y"].is_static


def test_opt_shapes_only_for_gpu_builds_with_symbolic_inputs():
    import importlib

    import kiln

    build = importlib.import_module("kiln.builder.build")
    net = SimpleNamespace(inputs=["x"], tensors={"x": SimpleNamespace(is_static=False, name="x", kind="tensor")})
    config = kiln.BuildConfig(profiles=({"x": ((1, 4), (8, 4), (16, 4))},))
    assert build.opt_tensor_shapes(net, config, SimpleNamespace(backend="cpu")) is None
    assert build.opt_tensor_shapes(net, kiln.BuildConfig(), FakeCuda()) is None


def test_a_layer_whose_unread_output_has_no_shape_is_checked_and_timed(monkeypatch):
    """A fused AddLayerNorm whose sum no layer reads (dtype and shape None) is still a static layer: the tuner checks
    its candidates instead of taking the first by priority (BERT's int8 add+LayerNorms went to torch that way)."""
    layer, spec = _specs()
    unread = LayerSpec(spec.name, spec.kind, {}, (ValueSpec(F32, (8, 40)), spec.inputs[1]),
                       (ValueSpec(F32, (8, 24)), ValueSpec(None, None)))
    assert unread.static
    assert not LayerSpec(spec.name, spec.kind, {}, unread.inputs,
                         (ValueSpec(F32, (8, 24)), ValueSpec(F32, None))).static
    monkeypatch.setattr(registry, "candidates", lambda s, d: ([BAD, GOOD], []))
    choice = Autotuner(FakeCuda(), 0, False, None).choose(unread)
    assert choice.tactic == "right"
    assert any(label.startswith("wrong_when_rows_over_4") and "wrong result" in why for label, why in choice.rejected)


def test_a_candidate_failing_at_the_max_shapes_is_rejected_with_the_shape(monkeypatch):
    """Right at opt (4 rows), wrong at the profile's max (8 rows): rejected, the reason naming the shape."""
    layer, spec = _specs()
    monkeypatch.setattr(registry, "candidates", lambda s, d: ([BAD, GOOD], []))
    at = lambda rows: at_shapes(spec, layer, {"x": (rows, 40), "y": (rows, 24)})  # noqa: E731
    checks = [("profile 0 min shapes (x 1x40)", at(1)), ("profile 0 max shapes (x 8x40)", at(8))]
    choice = Autotuner(FakeCuda(), 0, False, None).choose(spec, at(4), checks)
    assert choice.tactic == "right"
    label, why = choice.rejected[0]
    assert label == "wrong_when_rows_over_4" and why.startswith("fails at profile 0 max shapes (x 8x40): wrong result")
    assert Autotuner(FakeCuda(), 0, False, None).choose(spec, at(4), checks[:1]).tactic == "wrong_when_rows_over_4"


def test_each_profile_is_tuned_at_its_own_shapes_and_static_layers_once(monkeypatch):
    """Two profiles (1..4 rows, 4..16 rows): the symbolic MatMul gets a Choice per profile, checked over each range."""
    import importlib

    import kiln
    from kiln.builder.autotune import tune_profiles
    from kiln.kinds.interpret import to_device

    build = importlib.import_module("kiln.builder.build")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 24])],
                              [onnx.numpy_helper.from_array(W.numpy(), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    net = import_onnx(load_onnx(model.SerializeToString(), ModelLimits()).proto)
    config = kiln.BuildConfig(profiles=({"x": ((1, 40), (2, 40), (4, 40))}, {"x": ((4, 40), (8, 40), (16, 40))}))
    shapes = build.profile_tensor_shapes(net, config, FakeCuda())
    assert [s["max"]["y"] for s in shapes] == [(4, 24), (16, 24)]
    monkeypatch.setattr(registry, "candidates", lambda s, d: ([BAD, GOOD], []))
    weights = {k: to_device(v, "cpu") for k, v in net.constants.items()}
    per_profile = tune_profiles(net, weights, FakeCuda(), 0, False, None, lambda *a: None, None, shapes)
    name = net.layers[0].name
    assert [p[name].tactic for p in per_profile] == ["wrong_when_rows_over_4", "right"]
    assert "fails at profile 1" not in str(per_profile[1][name].rejected)  # it failed at opt already
    assert build.profile_tensor_shapes(net, config, SimpleNamespace(backend="cpu")) == [
        {"min": None, "opt": None, "max": None}] * 2


def test_an_attention_with_an_integer_keep_mask_is_checked(monkeypatch):
    """A FusedAttention reading a padding mask as given (int64, passes/attention_keep_mask.py) is checked and timed
    on random masks like any layer, not taken on priority as a layer reading indices is."""
    f16, i64 = DType.FLOAT16, DType.INT64
    qkv = (ValueSpec(f16, (1, 2, 8, 16)), ValueSpec(f16, (1, 2, 16, 8)), ValueSpec(f16, (1, 2, 8, 16)))
    spec = LayerSpec("attn", "FusedAttention", {"scale": None, "scale_on": "scores", "mask_fill": -1e4},
                     (*qkv, ValueSpec(i64, (1, 1, 1, 8))), (ValueSpec(f16, (1, 2, 8, 16)),))
    reference = registry.reference_kernel(spec)
    no_mask = Tactic("ignores_the_mask", ("FusedAttention",),
                     lambda s, config, device: (lambda inputs: reference(inputs[:3])))
    right = Tactic("right", ("FusedAttention",), lambda s, config, device: reference)
    monkeypatch.setattr(registry, "candidates", lambda s, d: ([no_mask, right], []))
    choice = Autotuner(FakeCuda(), 0, False, None).choose(spec)
    assert choice.tactic == "right"
    assert any(label.startswith("ignores_the_mask") and "wrong result" in why for label, why in choice.rejected)
