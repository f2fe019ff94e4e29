"""fuse_sibling_gemms: FusedGemm layers reading one input with the same epilogue become one wider FusedGemm
and a Split; outputs match the unmerged network (fp32, same products per column) and onnxruntime."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fuse_gemm_epilogue import fuse_gemm_epilogue
from kiln.passes.fuse_sibling_gemms import fuse_sibling_gemms

rng = np.random.default_rng(0)


def _c(name, shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _model(heads, relu_last=False):
    """x[2,3,8] → per head: MatMul(x, W[8,n]) + bias[n] (the last one through Relu when `relu_last`)."""
    nodes, inits, outs = [], [], []
    for i, n in enumerate(heads):
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        last = i == len(heads) - 1 and relu_last
        if last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"z{i}"]))
        nodes.append(helper.make_node("Identity", [f"z{i}" if last else f"a{i}"], [f"y{i}"]))
        inits += [_c(f"w{i}", (8, n)), _c(f"b{i}", (n,))]
        outs.append(helper.make_tensor_value_info(f"y{i}", T.FLOAT, [2, 3, n]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, 8])], outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _check(model, before, after):
    feeds = {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)}
    assert_same_outputs(before, after, feeds)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from passcheck import run
    got = run(after, feeds)
    for o, want in zip(sess.get_outputs(), sess.run(None, feeds)):
        np.testing.assert_allclose(got[o.name], want, rtol=1e-5, atol=1e-5)


def test_qkv_projections_merge():
    model = _model([4, 4, 6])
    before, _ = apply(imported(model), fuse_gemm_epilogue)
    assert kinds(before).count("FusedGemm") == 3
    after, ctx = apply(before, fuse_sibling_gemms)
    gemms = [l for l in after.layers if l.kind == "FusedGemm"]
    split = next(l for l in after.layers if l.kind == "Split")
    assert len(gemms) == 1 and split.inputs[0] == gemms[0].outputs[0]
    assert after.constants[gemms[0].inputs[1]].shape == (8, 14) and after.constants[gemms[0].inputs[2]].shape == (14,)
    sizes = dict(zip(split.outputs, after.constants[split.inputs[1]].tolist()))
    assert sizes == {"a0": 4, "a1": 4, "a2": 6}
    assert ctx.log["fuse_sibling_gemms.layers"] == 3
    _check(model, before, after)


def test_different_epilogues_stay_apart():
    model = _model([4, 4, 4], relu_last=True)
    before, _ = apply(imported(model), fuse_gemm_epilogue)
    after, _ = apply(before, fuse_sibling_gemms)
    acts = sorted(l.attrs["activation"] for l in after.layers if l.kind == "FusedGemm")
    assert acts == ["Relu", "none"] and kinds(after).count("Split") == 1
    _check(model, before, after)


def test_single_gemm_untouched():
    before, _ = apply(imported(_model([4])), fuse_gemm_epilogue)
    after, ctx = apply(before, fuse_sibling_gemms)
    assert kinds(after) == kinds(before) and "fuse_sibling_gemms.layers" not in ctx.log
