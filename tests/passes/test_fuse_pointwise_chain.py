"""fuse_pointwise_chain: trees of elementwise layers become one PointwiseChain with a program; results
agree with the unfused network exactly (the program runs the same references in the same order)."""

import numpy as np
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.ir import DType
from kiln.passes.fuse_pointwise_chain import fuse_pointwise_chain

rng = np.random.default_rng(0)
SHAPE = [2, 3, 4]


def _model(nodes, inits=(), inputs=("x", "y"), outputs=("z",)):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, T.FLOAT, SHAPE) for n in inputs],
                          [helper.make_tensor_value_info(n, T.FLOAT, SHAPE) for n in outputs], initializer=list(inits))
    return imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def _feeds(net):
    return {n: rng.standard_normal(SHAPE).astype(np.float32) for n in net.inputs}


def test_tree_with_broadcast_constant():
    nodes = [helper.make_node("Mul", ["x", "c"], ["a"]), helper.make_node("Add", ["a", "y"], ["b"]),
             helper.make_node("Tanh", ["b"], ["z"])]
    before = _model(nodes, [numpy_helper.from_array(np.float32([1, 2, 3, 4]), "c")])
    after, ctx = apply(before, fuse_pointwise_chain)
    assert kinds(after) == ["PointwiseChain"]
    layer = after.layers[0]
    assert layer.inputs == ["x", "c", "y"] and layer.outputs == ["z"]
    assert layer.attrs["program"] == [["Mul", [0, 1], []], ["Add", [3, 2], []], ["Tanh", [4], []]]
    assert ctx.log["fuse_pointwise_chain.layers"] == 2
    assert_same_outputs(before, after, _feeds(before), rtol=0, atol=0)


def test_cast_where_and_attributes():
    nodes = [helper.make_node("Greater", ["x", "y"], ["g"]), helper.make_node("LeakyRelu", ["x"], ["l"], alpha=0.1),
             helper.make_node("Where", ["g", "l", "y"], ["w"]), helper.make_node("Cast", ["w"], ["h"], to=T.FLOAT16),
             helper.make_node("Cast", ["h"], ["z"], to=T.FLOAT)]
    before = _model(nodes)
    after, _ = apply(before, fuse_pointwise_chain)
    assert kinds(after) == ["PointwiseChain"]
    program = after.layers[0].attrs["program"]
    assert [step[0] for step in program] == ["Greater", "LeakyRelu", "Where", "Cast", "Cast"]
    assert program[1][2] == ["alpha", program[1][2][1]] and program[3][2][:2] == ["to", DType.FLOAT16]
    assert_same_outputs(before, after, _feeds(before), rtol=0, atol=0)


def test_shared_intermediate_splits_the_tree():
    """a has two readers: it roots its own tree, read by the tree of z (and by the output w)."""
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Neg", ["e"], ["a"]),
             helper.make_node("Abs", ["a"], ["b"]), helper.make_node("Sqrt", ["b"], ["z"]),
             helper.make_node("Sin", ["a"], ["w"])]
    before = _model(nodes, inputs=("x",), outputs=("z", "w"))
    after, _ = apply(before, fuse_pointwise_chain)
    assert kinds(after) == ["PointwiseChain", "PointwiseChain", "Sin"]
    assert_same_outputs(before, after, _feeds(before), rtol=0, atol=0)


def test_runtime_broadcast_is_not_fused():
    g = helper.make_graph([helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Relu", ["a"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, SHAPE),
                           helper.make_tensor_value_info("y", T.FLOAT, [1, 3, 4])],
                          [helper.make_tensor_value_info("z", T.FLOAT, SHAPE)])
    before = imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    assert kinds(apply(before, fuse_pointwise_chain)[0]) == ["Add", "Relu"]
