"""eliminate_identity: Identity / inference Dropout / same-type Cast are bypassed, network outputs keep their names."""

import numpy as np
from onnx import TensorProto as T, helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.eliminate_identity import eliminate_identity


def _model(last_identity: bool):
    nodes = [helper.make_node("Identity", ["x"], ["a"], name="id0"),
             helper.make_node("Cast", ["a"], ["b"], name="cast_same", to=T.FLOAT),
             helper.make_node("Relu", ["b"], ["c"], name="relu")]
    out = "c"
    if last_identity:
        nodes.append(helper.make_node("Identity", ["c"], ["y"], name="id_out"))
        out = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                          [helper.make_tensor_value_info(out, T.FLOAT, [4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_bypasses_identity_and_noop_cast():
    before = imported(_model(False))
    after, _ = apply(before, eliminate_identity)
    assert kinds(after) == ["Relu"] and after.layers[0].inputs == ["x"]
    assert_same_outputs(before, after, {"x": np.array([-1, 0, 2, -3], np.float32)})


def test_output_identity_keeps_output_name():
    before = imported(_model(True))
    after, _ = apply(before, eliminate_identity)
    assert kinds(after) == ["Relu", "Identity"] and after.outputs == ["y"]
    assert_same_outputs(before, after, {"x": np.array([-1, 0, 2, -3], np.float32)})
