"""fold_batchnorm: Conv→BN and Gemm→BN become one Conv / Gemm with rescaled weights; results agree."""

import numpy as np
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fold_batchnorm import fold_batchnorm

rng = np.random.default_rng(0)


def _bn_inits(c):
    return [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "s"),
            numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b"),
            numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "m"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "v")]


def _model(producer, x_shape, w, extra_inits, attrs, out_shape, bias=True):
    ins = ["x", "w"] + (["bias"] if bias else [])
    nodes = [helper.make_node(producer, ins, ["y"], name="prod", **attrs),
             helper.make_node("BatchNormalization", ["y", "s", "b", "m", "v"], ["z"], name="bn", epsilon=1e-3)]
    inits = [numpy_helper.from_array(w, "w")] + extra_inits + _bn_inits(out_shape[1])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("z", T.FLOAT, list(out_shape))], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_conv_bn():
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    bias = [numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "bias")]
    before = imported(_model("Conv", (2, 4, 8, 8), w, bias, {"pads": [1, 1, 1, 1]}, (2, 6, 8, 8)))
    after, _ = apply(before, fold_batchnorm)
    assert kinds(before) == ["Conv", "BatchNormalization"] and kinds(after) == ["Conv"]
    assert after.layers[0].outputs == ["z"] and set(after.layers[0].origin) == {"prod", "bn"}
    assert_same_outputs(before, after, {"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)},
                        rtol=1e-4, atol=1e-5)


def test_conv_without_bias_bn():
    w = rng.standard_normal((6, 4, 1, 1)).astype(np.float32)
    before = imported(_model("Conv", (1, 4, 5, 5), w, [], {}, (1, 6, 5, 5), bias=False))
    after, _ = apply(before, fold_batchnorm)
    assert kinds(after) == ["Conv"] and len(after.layers[0].inputs) == 3
    assert_same_outputs(before, after, {"x": rng.standard_normal((1, 4, 5, 5)).astype(np.float32)},
                        rtol=1e-4, atol=1e-5)


def test_gemm_bn_transposed_weight():
    w = rng.standard_normal((5, 3)).astype(np.float32)  # transB=1: [N, K]
    c = [numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "bias")]
    before = imported(_model("Gemm", (4, 3), w, c, {"transB": 1, "beta": 0.5}, (4, 5)))
    after, _ = apply(before, fold_batchnorm)
    assert kinds(after) == ["Gemm"] and after.layers[0].attrs["beta"] == 1.0
    assert_same_outputs(before, after, {"x": rng.standard_normal((4, 3)).astype(np.float32)}, rtol=1e-4, atol=1e-5)


def test_shared_conv_output_is_not_folded():
    w = rng.standard_normal((6, 4, 1, 1)).astype(np.float32)
    model = _model("Conv", (1, 4, 5, 5), w, [], {}, (1, 6, 5, 5), bias=False)
    model.graph.output.append(helper.make_tensor_value_info("y", T.FLOAT, [1, 6, 5, 5]))
    after, _ = apply(imported(model), fold_batchnorm)
    assert kinds(after) == ["Conv", "BatchNormalization"]
