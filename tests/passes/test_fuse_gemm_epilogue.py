"""fuse_gemm_epilogue: MatMul/Gemm with a constant weight (+ bias) (+ activation) becomes one FusedGemm;
results agree with the unfused network at fp32 rtol 1e-5 (same ops, same order)."""

import math

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fuse_gemm_epilogue import fuse_gemm_epilogue

rng = np.random.default_rng(0)


def _c(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _model(nodes, x_shape, z_shape, inits, extra_outputs=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(n, T.FLOAT, list(z_shape)) for n in ["z", *extra_outputs]],
                          initializer=inits)
    return imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]))


def _matmul_model(tail, extra_inits=(), extra_outputs=()):
    """x[2,3,5] @ W[5,4] + bias[4] → `tail` (reads b, writes z)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Add", ["bias", "y"], ["b"])]
    inits = [_c("w", rng.standard_normal((5, 4))), _c("bias", rng.standard_normal(4)), *extra_inits]
    return _model(nodes + tail, (2, 3, 5), (2, 3, 4), inits, extra_outputs)


def _feeds(net):
    return {"x": rng.standard_normal(tuple(net.tensors["x"].shape)).astype(np.float32) * 2}


SQRT2 = [_c("sqrt2", math.sqrt(2)), _c("one", 1.0), _c("half", 0.5)]
ERF = [helper.make_node("Div", ["b", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
       helper.make_node("Add", ["e", "one"], ["e1"])]
TAILS = {
    "Relu": ([helper.make_node("Relu", ["b"], ["z"])], "Relu"),
    "Tanh": ([helper.make_node("Tanh", ["b"], ["z"])], "Tanh"),
    "Gelu": ([helper.make_node("Gelu", ["b"], ["z"], approximate="tanh")], "GeluTanh"),
    "SiLU": ([helper.make_node("Sigmoid", ["b"], ["s"]), helper.make_node("Mul", ["b", "s"], ["z"])], "SiLU"),
    # the Erf GELU as the TorchScript exporter writes it: (x·e)·0.5
    "erf_ts": (ERF + [helper.make_node("Mul", ["b", "e1"], ["m"]),
                      helper.make_node("Mul", ["m", "half"], ["z"])], "Gelu"),
    # ... as the dynamo exporter writes it: x·(0.5·e)
    "erf_dynamo": (ERF + [helper.make_node("Mul", ["half", "e1"], ["m"]),
                          helper.make_node("Mul", ["b", "m"], ["z"])], "Gelu"),
    # ... and (x·0.5)·e
    "erf_half_first": (ERF + [helper.make_node("Mul", ["b", "half"], ["m"]),
                              helper.make_node("Mul", ["m", "e1"], ["z"])], "Gelu"),
}


@pytest.mark.parametrize("tail", list(TAILS))
def test_matmul_bias_activation(tail):
    nodes, name = TAILS[tail]
    before = _matmul_model(nodes, SQRT2)
    after, ctx = apply(before, fuse_gemm_epilogue)
    assert kinds(after) == ["FusedGemm"], kinds(after)
    layer = after.layers[0]
    assert layer.inputs == ["x", "w", "bias"] and layer.outputs == ["z"]
    assert layer.attrs == {"trans_b": False, "activation": name, "activation_params": []}
    assert ctx.log["fuse_gemm_epilogue.layers"] == len(before.layers) - 1
    assert_same_outputs(before, after, _feeds(before))


def test_gemm_transposed_weight_scaled_bias():
    """Gemm's β·C becomes the bias constant; the [N, K] weight is kept, flagged trans_b."""
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, beta=0.5),
             helper.make_node("Tanh", ["y"], ["z"])]
    before = _model(nodes, (3, 5), (3, 4), [_c("w", rng.standard_normal((4, 5))), _c("c", rng.standard_normal((1, 4)))])
    after, _ = apply(before, fuse_gemm_epilogue)
    assert kinds(after) == ["FusedGemm"]
    layer = after.layers[0]
    assert (layer.attrs["trans_b"] is True and layer.inputs[1] == "w"
            and tuple(after.constants[layer.inputs[2]].shape) == (4,))
    assert_same_outputs(before, after, _feeds(before))


def test_matmul_without_bias():
    before = _model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                    (3, 5), (3, 4), [_c("w", rng.standard_normal((5, 4)))])
    after, _ = apply(before, fuse_gemm_epilogue)
    assert kinds(after) == ["FusedGemm"] and after.layers[0].inputs == ["x", "w"]
    assert_same_outputs(before, after, _feeds(before))


def test_not_fused():
    # a bias that is not 1-D of N (here [3, 4]) stays an Add; so does the activation after it
    rows = _model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "c"], ["b"]),
                   helper.make_node("Relu", ["b"], ["z"])], (3, 5), (3, 4),
                  [_c("w", rng.standard_normal((5, 4))), _c("c", rng.standard_normal((3, 4)))])
    assert kinds(apply(rows, fuse_gemm_epilogue)[0]) == ["MatMul", "Add", "Relu"]
    # an intermediate that is a network output
    shared = _matmul_model([helper.make_node("Relu", ["b"], ["z"])], extra_outputs=["b"])
    assert kinds(apply(shared, fuse_gemm_epilogue)[0]) == ["FusedGemm", "Relu"]
    # an Erf GELU whose input has a third reader
    leak = _matmul_model(TAILS["erf_ts"][0][:-1] + [helper.make_node("Mul", ["m", "half"], ["z"]),
                                                    helper.make_node("Neg", ["b"], ["n"])], SQRT2, extra_outputs=["n"])
    assert "Erf" in kinds(apply(leak, fuse_gemm_epilogue)[0])
