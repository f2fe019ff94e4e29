"""fold_shape_arithmetic: Shape/Size of statically known dims become constants, even beside dynamic dims."""

import numpy as np
from onnx import TensorProto as T, helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fold_constants import fold_constants
from kiln.passes.fold_shape_arithmetic import fold_shape_arithmetic


def _model():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape_tail", start=1),
             helper.make_node("Shape", ["x"], ["s_all"], name="shape_all"),
             helper.make_node("Size", ["x"], ["n"], name="size")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3, 5])],
                          [helper.make_tensor_value_info("s", T.INT64, [2]),
                           helper.make_tensor_value_info("s_all", T.INT64, [3]),
                           helper.make_tensor_value_info("n", T.INT64, [])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_folds_static_slice_only():
    before = imported(_model())
    after, _ = apply(before, fold_shape_arithmetic)
    assert kinds(before) == ["Shape", "Shape", "Size"]
    assert kinds(after) == ["Shape", "Size"]  # the dynamic batch dim keeps these two at run time
    assert after.constants["s"].tolist() == [3, 5]
    assert_same_outputs(before, after, {"x": np.zeros((7, 3, 5), np.float32)})


def test_static_shape_folds_everything():
    model = _model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 7
    before = imported(model)
    after, _ = apply(before, fold_shape_arithmetic, fold_constants)
    assert kinds(after) == []
    assert after.constants["n"].item() == 105
    assert_same_outputs(before, after, {"x": np.zeros((7, 3, 5), np.float32)})
