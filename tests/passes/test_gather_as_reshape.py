"""gather_as_reshape: a Gather whose constant indices count 0..n-1 along its axis becomes a Reshape with the same
output; indices out of order, a subset, repeated or negative (-1 for the last: left alone) keep the Gather."""

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.gather_as_reshape import gather_as_reshape


def _model(indices, axis, x_shape=(6, 1), out_shape=None):
    """x → Gather(x, constant indices, axis) → Relu → z (the Relu keeps z's producer a kernel)."""
    idx = np.asarray(indices, np.int64)
    out = out_shape or [*x_shape[:axis], *idx.shape, *x_shape[axis + 1:]]
    g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis),
                           helper.make_node("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("z", T.FLOAT, out)],
                          initializer=[numpy_helper.from_array(idx, "i")])
    return imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("indices, axis, x_shape", [
    (np.arange(6).reshape(2, 1, 1, 3), 0, (6, 1)),  # BERT's mask: [B·S, 1] gathered as [B, 1, 1, S]
    (np.arange(4), 1, (2, 4, 3)),
    (np.arange(4).reshape(2, 2), -2, (3, 4, 5)),
])
def test_counting_indices_make_a_reshape(indices, axis, x_shape):
    net = _model(indices, axis, x_shape)
    after, ctx = apply(net, gather_as_reshape)
    assert kinds(after) == ["Reshape", "Relu"] and ctx.log["gather_as_reshape.layers"] == 1
    feeds = {"x": np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)}
    assert_same_outputs(net, after, feeds, rtol=0, atol=0)


@pytest.mark.parametrize("indices", [[1, 0, 2, 3, 4, 5], [0, 1, 2], [0, 1, 2, 3, 4, 4], [0, 1, 2, 3, 4, -1]])
def test_other_indices_keep_the_gather(indices):
    net = _model(indices, 0)
    after, _ = apply(net, gather_as_reshape)
    assert kinds(after) == ["Gather", "Relu"]
