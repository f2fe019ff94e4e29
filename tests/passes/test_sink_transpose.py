"""sink_transpose: a Transpose of the leading dims read only by a GEMM moves below it (rows commute with the
GEMM); one that moves the last axis, or that another layer reads too, stays."""

import numpy as np
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fuse_gemm_epilogue import fuse_gemm_epilogue
from kiln.passes.sink_transpose import sink_transpose

rng = np.random.default_rng(0)


def _model(perm, extra_reader=False):
    """x [2, 3, 8] → Transpose(perm) → MatMul W [K, 6] + bias → Relu → y (and Transpose → Neg → z)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
             helper.make_node("MatMul", ["t", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    t_shape = [[2, 3, 8][p] for p in perm]
    outs = [helper.make_tensor_value_info("y", T.FLOAT, t_shape[:-1] + [6])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["t"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", T.FLOAT, t_shape))
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (t_shape[-1], 6)), ("b", (6,)))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, 8])], outs,
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _feeds():
    return {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)}


def test_transpose_moves_below_the_gemm():
    before = imported(_model([1, 0, 2]))
    after, ctx = apply(before, fuse_gemm_epilogue, sink_transpose)
    assert kinds(after) == ["FusedGemm", "Transpose"]
    gemm, tr = after.layers
    assert gemm.inputs[0] == "x" and tr.inputs == [gemm.outputs[0]] and tr.outputs == ["y"]
    assert after.tensors[gemm.outputs[0]].shape == (2, 3, 6) and ctx.log["sink_transpose.layers"] == 1
    assert_same_outputs(before, after, _feeds())


def test_transpose_of_the_last_axis_stays():
    before = imported(_model([0, 2, 1]))
    after, _ = apply(before, fuse_gemm_epilogue, sink_transpose)
    assert kinds(after) == ["Transpose", "FusedGemm"]


def test_transpose_with_another_reader_stays():
    before = imported(_model([1, 0, 2], extra_reader=True))
    after, _ = apply(before, fuse_gemm_epilogue, sink_transpose)
    assert kinds(after)[0] == "Transpose" and after.layers[1].inputs[0] == after.layers[0].outputs[0]
    assert_same_outputs(before, after, _feeds())
