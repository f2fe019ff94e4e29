"""A custom-domain op is refused with a pointer to plugins, then runs once registered as one."""

import numpy as np
import pytest
import torch
from onnx import helper, TensorProto as T

import kiln
from kiln.errors import UnsupportedOpError


def _model():
    node = helper.make_node("Swish", ["x"], ["y"], name="swish0", domain="com.example", beta=2.0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def test_unknown_op_names_node_domain_and_plugins():
    with pytest.raises(UnsupportedOpError) as e:
        kiln.build(_model())
    msg = str(e.value)
    assert "swish0" in msg and "Swish" in msg and "com.example" in msg and "plugin" in msg


def test_plugin_op_runs():
    from kiln.plugins import register_op

    register_op("Swish", lambda ins, a: ins[0] * torch.sigmoid(a["beta"] * ins[0]), domain="com.example")
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    y = kiln.build(_model()).run({"x": x})["y"]
    np.testing.assert_allclose(y, x / (1 + np.exp(-2.0 * x)), rtol=1e-6, atol=1e-6)
