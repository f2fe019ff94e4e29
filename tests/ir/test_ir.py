"""The IR's value kinds (tensor, sequence, optional), nested bodies: verify, print, memory plan, plan files."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from test_controlflow import model, vi

import kiln
from kiln.engine.serialize import MAX_DEPTH, network_from_json, network_to_json
from kiln.errors import InternalError, ModelError, PlanError
from kiln.ir import DType, Layer, Network, Tensor
from kiln.kinds.verify import verify_network
from kiln.runtime.memory_plan import plan_memory


def test_value_kinds_print_their_element_type():
    assert repr(Tensor("x", DType.FLOAT32, (2, None))) == "x: float32[2,?]"
    assert repr(Tensor("s", DType.INT64, None, "sequence")) == "s: seq<int64?>"
    assert repr(Tensor("o", DType.FLOAT16, (3,), "optional")) == "o: opt<float16[3]>"
    assert repr(Tensor("q", DType.BOOL, (), "optional_sequence")) == "q: opt<seq<bool[]>>"
    assert not Tensor("s", DType.INT64, (2,), "sequence").is_static
    with pytest.raises(InternalError, match="value kind"):
        Tensor("m", DType.FLOAT32, (), "map")


def _if_network() -> Network:
    """y = If(c) then (x + w) else (x), with x and w captured."""
    def branch(name, kind):
        b = Network(name)
        for n in ("x", "w"):
            b.add_tensor(n, DType.FLOAT32, (2,))
            b.inputs.append(n)
        if kind == "Add":
            b.add_tensor("t", DType.FLOAT32, (2,))
            b.layers.append(Layer("add", "Add", ["x", "w"], ["t"]))
        b.outputs = ["t" if kind == "Add" else "x"]
        return b

    net = Network("outer")
    net.add_tensor("c", DType.BOOL, ())
    net.add_tensor("x", DType.FLOAT32, (2,))
    net.inputs = ["c", "x"]
    net.add_constant("w", torch.ones(2))
    net.add_constant("names", np.array(["a", "bc"], dtype=object))
    net.add_tensor("y", DType.FLOAT32, (2,))
    net.layers.append(Layer("if", "If", ["c", "x", "w"], ["y"],
                            {"then_branch": branch("then", "Add"), "else_branch": branch("else", None)}))
    net.outputs = ["y"]
    return net


def test_printer_shows_bodies_nested():
    text = str(_if_network())
    assert "then_branch: network then" in text and "           0 Add add(x, w) -> t: float32[2]" in text


def test_verify_checks_body_arity_and_bodies():
    net = _if_network()
    verify_network(net)
    net.layers[0].attrs["else_branch"].inputs.pop()
    with pytest.raises(InternalError, match="body 'else_branch' has 1 inputs"):
        verify_network(net)
    net = _if_network()
    net.layers[0].attrs["then_branch"].layers[0].inputs[0] = "nowhere"
    with pytest.raises(InternalError, match="reads 'nowhere'"):
        verify_network(net)
    net.layers[0].attrs["then_branch"] = "not a network"
    with pytest.raises(InternalError, match="not a network"):
        verify_network(net)


def test_nested_networks_and_string_constants_round_trip():
    manifest, tensors = network_to_json(_if_network())
    net = network_from_json(manifest, tensors)
    assert str(net) == str(_if_network())
    assert net.constants["names"].tolist() == ["a", "bc"] and net.constants["names"].dtype == object


def _corrupt(edit, match=None):
    manifest, tensors = network_to_json(_if_network())
    manifest = copy.deepcopy(manifest)
    edit(manifest)
    with pytest.raises(PlanError, match=match):
        network_from_json(manifest, tensors)


@pytest.mark.parametrize("edit", [
    lambda m: m["tensors"][0].update(kind="map"),
    lambda m: m["strings"]["names"].update(values=[1, 2]),
    lambda m: m["strings"]["names"].update(shape=[-1]),
    lambda m: m["strings"]["names"].update(shape=[3]),
    lambda m: m["layers"][0]["attrs"].update(then_branch={"$network": []}),
    lambda m: m["layers"][0]["attrs"].update(then_branch=3),
    lambda m: m["layers"][0]["attrs"]["else_branch"]["$network"].update(outputs=[]),
    lambda m: m["layers"][0]["attrs"]["then_branch"]["$network"]["layers"][0].update(kind="NoSuchKind"),
])
def test_malformed_manifests_are_plan_errors(edit):
    _corrupt(edit)


def test_body_nesting_is_capped():
    def nest(m, depth):
        body = m["layers"][0]["attrs"]["then_branch"]["$network"]
        if depth:
            body["layers"] = [copy.deepcopy(m["layers"][0])]
            nest(body, depth - 1)

    _corrupt(lambda m: nest(m, MAX_DEPTH + 1), match="deeper than")


def test_memory_plan_keeps_captures_alive_and_host_values_out_of_the_arena():
    net = Network("n")
    net.add_tensor("x", DType.FLOAT32, (4,))
    net.inputs = ["x"]
    for name, kind in (("a", "tensor"), ("s", "sequence"), ("b", "tensor"), ("y", "tensor")):
        net.add_tensor(name, DType.FLOAT32, (4,), kind)
    net.layers = [Layer("l0", "Neg", ["x"], ["a"]), Layer("l1", "SequenceConstruct", ["x"], ["s"]),
                  Layer("l2", "SequenceAt", ["s", ""], ["b"]), Layer("l3", "Add", ["a", "b"], ["y"])]
    net.outputs = ["y"]
    plan = plan_memory(net, placed={"l0", "l1", "l2"})
    assert "a" in plan.release[3] and "s" in plan.release[2]
    assert "s" not in plan.offsets and {"a", "b"} <= set(plan.offsets)


def test_plan_file_with_loop_round_trips(tmp_path):
    body = h.make_graph([h.make_node("Add", ["v", "w"], ["v_out"]), h.make_node("Or", ["c_in", "c_in"], ["c_out"])],
                        "body", [vi("i", T.INT64, []), vi("c_in", T.BOOL, []), vi("v", T.FLOAT, [2])],
                        [vi("c_out", T.BOOL, []), vi("v_out", T.FLOAT, [2])])
    w = onnx.numpy_helper.from_array(np.arange(4096, dtype=np.float32)[:2].copy(), "w")
    m = model([h.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
              [vi("M", T.INT64, []), vi("v0", T.FLOAT, [2])], [vi("v", T.FLOAT, [2])], initializers=[w])
    engine = kiln.build(m, kiln.BuildConfig(device="cpu"))
    engine.save(tmp_path / "loop.plan")
    feeds = {"M": np.array(3), "v0": np.zeros(2, np.float32)}
    np.testing.assert_array_equal(kiln.load(tmp_path / "loop.plan").run(feeds)["v"], [0, 3])


def test_untyped_output_names_the_node_and_the_fix():
    node = h.make_node("Neg", ["x"], ["y"], name="neg")
    m = h.make_model(h.make_graph([node], "g", [vi("x", T.FLOAT, [2])], [h.make_value_info("y", onnx.TypeProto())]),
                     opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    from kiln.frontend.onnx.importer import import_onnx

    with pytest.raises(ModelError, match=r"node 'neg'.*gave no type for output 'y'.*value_info"):
        import_onnx(m)


@pytest.mark.parametrize("edit", [{"num_scan_inputs": 0}, {"captures": -1}, {"scan_output_axes": []}, {"batched": 1}])
def test_malformed_scan_attributes_are_plan_errors(edit):
    body = h.make_graph([h.make_node("Add", ["acc", "x"], ["acc_out"]), h.make_node("Mul", ["x", "w"], ["y"])], "body",
                        [vi("acc", T.FLOAT, [2]), vi("x", T.FLOAT, [2])],
                        [vi("acc_out", T.FLOAT, [2]), vi("y", T.FLOAT, [2])])
    m = model([h.make_node("Scan", ["a0", "xs"], ["a", "ys"], body=body, num_scan_inputs=1)],
              [vi("a0", T.FLOAT, [2]), vi("xs", T.FLOAT, [3, 2]), vi("w", T.FLOAT, [2])],
              [vi("a", T.FLOAT, [2]), vi("ys", T.FLOAT, [3, 2])])
    manifest, tensors = network_to_json(kiln.build(m, kiln.BuildConfig(device="cpu")).network)
    network_from_json(copy.deepcopy(manifest), tensors)
    manifest["layers"][0]["attrs"].update(edit)
    with pytest.raises(PlanError, match="inconsistent"):
        network_from_json(manifest, tensors)
