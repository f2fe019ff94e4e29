"""eliminate_dead: unread layers and constants disappear; outputs are unchanged."""

import numpy as np
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.eliminate_dead import eliminate_dead


def _model():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="live"),
             helper.make_node("Add", ["x", "c"], ["unused"], name="dead_add"),
             helper.make_node("Mul", ["unused", "x"], ["unused2"], name="dead_mul")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])],
                          initializer=[numpy_helper.from_array(np.ones((2, 3), np.float32), "c")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_removes_dead_chain_and_constant():
    before = imported(_model())
    after, ctx = apply(before, eliminate_dead)
    assert kinds(before) == ["Relu", "Add", "Mul"]
    assert kinds(after) == ["Relu"]
    assert "c" not in after.constants and "unused" not in after.tensors
    assert ctx.log["eliminate_dead"] == 1
    assert_same_outputs(before, after, {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)})
