"""fuse_conv_epilogue: Conv (+ residual Add) (+ activation) becomes one FusedConv; results agree with
the unfused network at fp32 rtol 1e-5 (the fused reference runs the same ops in the same order)."""

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fuse_conv_epilogue import fuse_conv_epilogue

rng = np.random.default_rng(0)
X = (1, 4, 6, 6)
Y = (1, 6, 6, 6)


def _model(tail, extra_inputs=(), extra_outputs=(), inits=()):
    """x → Conv(3x3, pad 1, bias) → `tail` nodes; the last node writes z."""
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"), *inits]
    ins = [helper.make_tensor_value_info(n, T.FLOAT, list(s)) for n, s in [("x", X), *extra_inputs]]
    outs = [helper.make_tensor_value_info(n, T.FLOAT, list(Y)) for n in ["z", *extra_outputs]]
    g = helper.make_graph([conv, *tail], "g", ins, outs, initializer=inits)
    return imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _feeds(net):
    return {n: rng.standard_normal(tuple(net.tensors[n].shape)).astype(np.float32) for n in net.inputs}


def _const(name, value):
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def test_residual_and_relu():
    before = _model([helper.make_node("Add", ["r", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])],
                    extra_inputs=[("r", Y)])
    after, ctx = apply(before, fuse_conv_epilogue)
    assert kinds(before) == ["Conv", "Add", "Relu"] and kinds(after) == ["FusedConv"]
    layer = after.layers[0]
    assert layer.inputs == ["x", "w", "b", "r"] and layer.outputs == ["z"]
    assert layer.attrs["residual"] is True and layer.attrs["activation"] == "Relu"
    assert layer.attrs["pads"] == [1, 1, 1, 1] and ctx.log["fuse_conv_epilogue.layers"] == 2
    assert_same_outputs(before, after, _feeds(before))


ACTIVATIONS = [
    ([helper.make_node("Clip", ["y", "lo", "hi"], ["z"])], [_const("lo", 0.0), _const("hi", 6.0)], "Clip", [0.0, 6.0]),
    ([helper.make_node("Sigmoid", ["y"], ["z"])], [], "Sigmoid", []),
    ([helper.make_node("LeakyRelu", ["y"], ["z"], alpha=0.2)], [], "LeakyRelu", [pytest.approx(0.2)]),
    ([helper.make_node("HardSwish", ["y"], ["z"])], [], "HardSwish", []),
    ([helper.make_node("Sigmoid", ["y"], ["g"]), helper.make_node("Mul", ["g", "y"], ["z"])], [], "SiLU", []),
]


@pytest.mark.parametrize("tail, inits, name, params", ACTIVATIONS, ids=[a[2] for a in ACTIVATIONS])
def test_activation(tail, inits, name, params):
    before = _model(tail, inits=inits)
    after, _ = apply(before, fuse_conv_epilogue)
    assert kinds(after) == ["FusedConv"]
    attrs = after.layers[0].attrs
    assert attrs["activation"] == name and attrs["activation_params"] == params and attrs["residual"] is False
    assert_same_outputs(before, after, _feeds(before))


def test_intermediate_output_is_not_fused():
    before = _model([helper.make_node("Relu", ["y"], ["z"])], extra_outputs=["y"])
    after, _ = apply(before, fuse_conv_epilogue)
    assert kinds(after) == ["Conv", "Relu"]


def test_broadcast_residual_is_not_taken():
    """An Add whose other operand broadcasts is no residual, so the Relu after it is out of reach too."""
    before = _model([helper.make_node("Add", ["y", "r"], ["s"]), helper.make_node("Relu", ["s"], ["z"])],
                    extra_inputs=[("r", (1, 6, 1, 1))])
    after, _ = apply(before, fuse_conv_epilogue)
    assert kinds(after) == ["Conv", "Add", "Relu"]
    assert_same_outputs(before, after, _feeds(before))
