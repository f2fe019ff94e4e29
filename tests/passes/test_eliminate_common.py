"""eliminate_common: a layer repeating an earlier one (constants compared by value) is dropped and its readers
read the first; outputs match the original network and onnxruntime. Network outputs and random layers stay."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds, run
from kiln.passes.eliminate_common import eliminate_common

rng = np.random.default_rng(0)


def _f(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _model(extra_nodes=(), extra_outputs=()):
    """BERT's per-layer mask: Where(mask, 0, -inf) twice with equal constants under different names."""
    nodes = [helper.make_node("Where", ["m", "zero0", "ninf0"], ["w0"]), helper.make_node("Add", ["x", "w0"], ["y0"]),
             helper.make_node("Where", ["m", "zero1", "ninf1"], ["w1"]), helper.make_node("Add", ["y0", "w1"], ["y1"]),
             *extra_nodes]
    inits = [_f("zero0", [0.0]), _f("ninf0", [-np.inf]), _f("zero1", [0.0]), _f("ninf1", [-np.inf])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("m", T.BOOL, [2, 4]),
                                       helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info(n, T.FLOAT, [2, 4]) for n in ["y1", *extra_outputs]],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _feeds():
    return {"m": rng.random((2, 4)) > 0.5, "x": rng.standard_normal((2, 4)).astype(np.float32)}


def test_repeated_mask_computed_once():
    model = _model()
    before = imported(model)
    after, ctx = apply(before, eliminate_common)
    assert kinds(after) == ["Where", "Add", "Add"] and ctx.log["eliminate_common.layers"] == 1
    assert after.layers[2].inputs == ["y0", "w0"]
    feeds = _feeds()
    assert_same_outputs(before, after, feeds)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(run(after, feeds)["y1"], want)


def test_different_constants_and_network_outputs_kept():
    nodes = [helper.make_node("Where", ["m", "zero0", "one"], ["w2"]), helper.make_node("Add", ["x", "w2"], ["y2"])]
    model = _model(nodes, ["y2"])
    model.graph.initializer.append(_f("one", [1.0]))
    after, _ = apply(imported(model), eliminate_common)
    assert kinds(after).count("Where") == 2  # the third Where's -inf became 1: not a repeat
    # a repeat whose output is a network output stays
    model = _model([helper.make_node("Where", ["m", "zero1", "ninf1"], ["w3"])], ["w3"])
    after, _ = apply(imported(model), eliminate_common)
    assert kinds(after).count("Where") == 2
