"""fold_constants: constant subgraphs are evaluated at build time, within the output-size budget."""

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import kiln
from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fold_constants import fold_constants

rng = np.random.default_rng(0)


def _model(a_shape=(3, 4)):
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(a_shape).astype(np.float32)
    nodes = [helper.make_node("Add", ["a", "b"], ["c"], name="const_add"),
             helper.make_node("Relu", ["c"], ["d"], name="const_relu"),
             helper.make_node("Mul", ["x", "d"], ["y"], name="mul")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, list(a_shape))],
                          [helper.make_tensor_value_info("y", T.FLOAT, list(a_shape))],
                          initializer=[numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_folds_constant_chain():
    before = imported(_model())
    after, ctx = apply(before, fold_constants)
    assert kinds(before) == ["Add", "Relu", "Mul"] and kinds(after) == ["Mul"]
    assert "d" in after.constants and ctx.log["fold_constants"] >= 1
    assert_same_outputs(before, after, {"x": rng.standard_normal((3, 4)).astype(np.float32)})


def test_budget_leaves_large_results_as_layers():
    before = imported(_model((64, 64)))  # 16 KiB per folded tensor
    after, _ = apply(before, fold_constants, fold_budget_bytes=1024)
    assert kinds(after) == ["Add", "Relu", "Mul"]
    assert_same_outputs(before, after, {"x": rng.standard_normal((64, 64)).astype(np.float32)})


def test_bad_constants_are_a_model_error():
    a = numpy_helper.from_array(np.ones((2, 3), np.float32), "a")
    b = numpy_helper.from_array(np.ones((4, 5), np.float32), "b")
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="bad_add")], "g", [],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])], initializer=[a, b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(kiln.KilnError, match="bad_add"):
        kiln.build(model, kiln.BuildConfig(device="cpu"))
