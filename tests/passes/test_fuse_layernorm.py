"""fuse_layernorm: the written-out LayerNorm becomes LayerNormalization, Add → LayerNormalization becomes
AddLayerNorm; results agree with the unfused network at fp32 rtol 1e-5 (atol 1e-5: LayerNormalization
divides by rsqrt where the pattern takes sqrt then divides, a few ulps on unit-scale outputs)."""

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fuse_layernorm import fuse_layernorm

rng = np.random.default_rng(0)
SHAPE = (2, 3, 8)


def _c(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(nodes, inits, inputs=("x",), outputs=("z",), elem=T.FLOAT, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, elem, list(SHAPE)) for n in inputs],
                          [helper.make_tensor_value_info(n, elem, list(SHAPE)) for n in outputs], initializer=inits)
    return imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _decomposed(square="Pow", divide="Div", affine=True, axes=(-1,)):
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=list(axes)), helper.make_node("Sub", ["x", "m"], ["d"]),
             (helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "Pow"
              else helper.make_node("Mul", ["d", "d"], ["sq"])),
             helper.make_node("ReduceMean", ["sq"], ["v"], axes=list(axes)),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"])]
    if divide == "Div":
        nodes.append(helper.make_node("Div", ["d", "s"], ["n" if affine else "z"]))
    else:
        nodes += [helper.make_node("Reciprocal", ["s"], ["r"]),
                  helper.make_node("Mul", ["r", "d"], ["n" if affine else "z"])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]), helper.make_node("Add", ["beta", "g"], ["z"])]
    norm = SHAPE[len(SHAPE) - len(axes):]
    inits = [_c("two", 2.0), _c("eps", 1e-5), _c("gamma", rng.uniform(0.5, 1.5, norm)),
             _c("beta", rng.standard_normal(norm))]
    return _model(nodes, inits, opset=17)


def _feeds(net):
    return {n: rng.standard_normal(SHAPE).astype(np.float32) * 3 + 1 for n in net.inputs}


@pytest.mark.parametrize("square, divide, affine", [("Pow", "Div", True), ("Mul", "Reciprocal", True),
                                                    ("Pow", "Div", False)])
def test_decomposed(square, divide, affine):
    before = _decomposed(square, divide, affine)
    after, ctx = apply(before, fuse_layernorm)
    assert kinds(after) == ["LayerNormalization"], kinds(after)
    layer = after.layers[0]
    assert layer.attrs["axis"] == 2 and layer.attrs["epsilon"] == pytest.approx(1e-5) and layer.outputs == ["z"]
    assert len(layer.inputs) == (3 if affine else 2) and tuple(after.constants[layer.inputs[1]].shape) == (8,)
    assert ctx.log["fuse_layernorm.layers"] == len(before.layers) - 1
    assert_same_outputs(before, after, _feeds(before), atol=1e-5)


def test_decomposed_over_two_axes():
    before = _decomposed(axes=(1, 2))
    after, _ = apply(before, fuse_layernorm)
    assert kinds(after) == ["LayerNormalization"] and after.layers[0].attrs["axis"] == 1
    assert_same_outputs(before, after, _feeds(before), atol=1e-5)


def test_not_trailing_axes_is_not_fused():
    before = _decomposed(axes=(1,))
    assert "LayerNormalization" not in kinds(apply(before, fuse_layernorm)[0])


def _add_ln(extra_outputs=()):
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["z"], epsilon=1e-6)]
    inits = [_c("gamma", rng.uniform(0.5, 1.5, 8)), _c("beta", rng.standard_normal(8))]
    return _model(nodes, inits, inputs=("a", "b"), outputs=("z", *extra_outputs))


@pytest.mark.parametrize("sum_escapes", [False, True])
def test_add_layernorm(sum_escapes):
    before = _add_ln(["s"] if sum_escapes else [])
    after, ctx = apply(before, fuse_layernorm)
    assert kinds(after) == ["AddLayerNorm"]
    layer = after.layers[0]
    assert layer.inputs == ["a", "b", "gamma", "beta"] and layer.outputs == (["z", "s"] if sum_escapes else ["z"])
    assert layer.attrs["epsilon"] == pytest.approx(1e-6) and ctx.log["fuse_layernorm.add_layernorm"] == 1
    assert_same_outputs(before, after, _feeds(before))


def test_half_precision_is_not_fused():
    """LayerNormalization takes fp32 statistics; the fp16 ops it would replace do not."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["z"])]
    before = _model(nodes, [_c("eps", 1e-5, np.float16)], elem=T.FLOAT16)
    assert kinds(apply(before, fuse_layernorm)[0]) == kinds(before)
