"""fuse_attention: MatMul → scale → mask Add → Softmax → MatMul becomes one FusedAttention; results agree
with the unfused network at fp32 rtol 1e-5 (atol 1e-6: a scale moved from Q and K to the scores, or a
Div turned into a Mul, changes roundings by an ulp)."""

import math

import numpy as np
import pytest
import torch
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds, run
from kiln.kinds import run_reference
from kiln.passes.fuse_attention import fuse_attention

rng = np.random.default_rng(0)
B, H, S, D = 2, 3, 5, 4


def _c(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(nodes, inits=(), mask=False, extra_outputs=()):
    """Inputs q [B,H,S,D], kt [B,H,D,S], v [B,H,S,D] (and mask [B,1,S,S]); output z."""
    ins = [("q", [B, H, S, D]), ("kt", [B, H, D, S]), ("v", [B, H, S, D])] + ([("mask", [B, 1, S, S])] if mask else [])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in ins],
                          [helper.make_tensor_value_info(n, T.FLOAT, [B, H, S, D if n == "z" else S])
                           for n in ["z", *extra_outputs]], initializer=list(inits))
    return imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def _feeds(net):
    feeds = {n: rng.standard_normal(tuple(net.tensors[n].shape)).astype(np.float32) for n in net.inputs}
    if "mask" in feeds:
        feeds["mask"] = np.where(feeds["mask"] > 0.5, np.float32(np.finfo(np.float32).min), np.float32(0))
    return feeds


def _tail(src="u"):
    return [helper.make_node("Softmax", [src], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["z"])]


def test_scaled_masked_scores():
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "c"], ["t"]),
             helper.make_node("Add", ["t", "mask"], ["u"])] + _tail()
    before = _model(nodes, [_c("c", 0.5)], mask=True)
    after, ctx = apply(before, fuse_attention)
    assert kinds(after) == ["FusedAttention"]
    layer = after.layers[0]
    assert layer.inputs == ["q", "kt", "v", "mask"] and layer.outputs == ["z"]
    assert (layer.attrs == {"scale": 0.5, "scale_on": "scores", "nan_to_zero": False}
            and ctx.log["fuse_attention.layers"] == 4)
    assert_same_outputs(before, after, _feeds(before))


def test_div_scale_mask_first():
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Div", ["s", "c"], ["t"]),
             helper.make_node("Add", ["mask", "t"], ["u"])] + _tail()
    before = _model(nodes, [_c("c", [8.0])], mask=True)
    after, _ = apply(before, fuse_attention)
    assert kinds(after) == ["FusedAttention"] and after.layers[0].attrs["scale"] == 0.125
    assert_same_outputs(before, after, _feeds(before))


def test_scale_on_q_and_k():
    """torch's SDPA decomposition: Q and Kᵀ each times √scale."""
    nodes = [helper.make_node("Mul", ["q", "r"], ["qs"]), helper.make_node("Mul", ["kt", "r"], ["ks"]),
             helper.make_node("MatMul", ["qs", "ks"], ["u"])] + _tail()
    r = np.float32(math.sqrt(1 / math.sqrt(D)))
    before = _model(nodes, [_c("r", r)])
    after, _ = apply(before, fuse_attention)
    assert kinds(after) == ["FusedAttention"]
    assert after.layers[0].inputs == ["q", "kt", "v"]
    assert after.layers[0].attrs == {"scale": pytest.approx(float(r) ** 2, rel=1e-12), "scale_on": "qk",
                                     "nan_to_zero": False}
    assert_same_outputs(before, after, _feeds(before))


def test_scale_from_q_shape():
    """The TorchScript exporter computes √(1/√D) from Shape(Q) at run time: scale=None (1/√D)."""
    nodes = [helper.make_node("Shape", ["q"], ["shp"]), helper.make_node("Slice", ["shp", "m1", "big"], ["d"]),
             helper.make_node("Cast", ["d"], ["df"], to=T.FLOAT), helper.make_node("Sqrt", ["df"], ["sd"]),
             helper.make_node("Div", ["one", "sd"], ["inv"]), helper.make_node("Sqrt", ["inv"], ["r1"]),
             helper.make_node("Sqrt", ["inv"], ["r2"]), helper.make_node("Mul", ["q", "r1"], ["qs"]),
             helper.make_node("Mul", ["kt", "r2"], ["ks"]), helper.make_node("MatMul", ["qs", "ks"], ["u"])] + _tail()
    inits = [_c("m1", [-1], np.int64), _c("big", [2**62], np.int64), _c("one", 1.0)]
    before = _model(nodes, inits)
    after, _ = apply(before, fuse_attention)
    fused = [l for l in after.layers if l.kind == "FusedAttention"]
    assert (len(fused) == 1 and fused[0].attrs == {"scale": None, "scale_on": "qk", "nan_to_zero": False}
            and fused[0].inputs == ["q", "kt", "v"])
    assert_same_outputs(before, after, _feeds(before))


def test_not_fused():
    # Softmax over another axis
    other_axis = [helper.make_node("MatMul", ["q", "kt"], ["u"]), helper.make_node("Softmax", ["u"], ["p"], axis=2),
                  helper.make_node("MatMul", ["p", "v"], ["z"])]
    assert "FusedAttention" not in kinds(apply(_model(other_axis), fuse_attention)[0])
    # the probabilities are also a network output
    shared = _model([helper.make_node("MatMul", ["q", "kt"], ["u"])] + _tail(), extra_outputs=["p"])
    assert "FusedAttention" not in kinds(apply(shared, fuse_attention)[0])


def test_no_scale_no_mask():
    before = _model([helper.make_node("MatMul", ["q", "kt"], ["u"])] + _tail())
    after, _ = apply(before, fuse_attention)
    assert kinds(after) == ["FusedAttention"] and after.layers[0].attrs == {"scale": 1.0, "scale_on": "scores",
                                                                            "nan_to_zero": False}
    assert_same_outputs(before, after, _feeds(before))


def _safe_softmax(fill=0.0):
    """SDPA's safe softmax as the exporters write it: Where(IsNaN(p), fill, p) before the product with V."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "mask"], ["u"]),
             helper.make_node("Softmax", ["u"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["w"]), helper.make_node("MatMul", ["w", "v"], ["z"])]
    return _model(nodes, [_c("zero", [fill])], mask=True)


def test_safe_softmax_fully_masked_rows():
    """A mask row of all -inf (transformers' SDPA padding mask) gives NaN probabilities, zeroed by the guard."""
    before = _safe_softmax()
    after, ctx = apply(before, fuse_attention)
    assert kinds(after) == ["FusedAttention"] and after.layers[0].attrs["nan_to_zero"] is True
    assert ctx.log["fuse_attention.layers"] == 5
    feeds = _feeds(before)
    feeds["mask"] = np.where(feeds["mask"] < 0, np.float32(-np.inf), np.float32(0))
    feeds["mask"][0, 0, 1] = -np.inf
    assert_same_outputs(before, after, feeds)
    z = run(after, feeds)["z"]
    assert np.all(z[0, :, 1] == 0) and not np.isnan(z).any()


def test_safe_softmax_not_fused():
    # a fill other than 0 is not SDPA's guard
    assert "FusedAttention" not in kinds(apply(_safe_softmax(fill=1.0), fuse_attention)[0])
    # the guarded probabilities are also a network output
    before = _safe_softmax()
    before.outputs.append("w")
    assert "FusedAttention" not in kinds(apply(before, fuse_attention)[0])


def test_reference_nan_to_zero_optional():
    """Attrs without nan_to_zero (plans written before it existed) keep the NaN of a fully masked row."""
    q, kt, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 4, 3), torch.randn(1, 2, 3, 4)
    mask = torch.zeros(1, 1, 3, 3)
    mask[..., 2, :] = -torch.inf
    old = run_reference("FusedAttention", [q, kt, v, mask], {"scale": None, "scale_on": "scores"})[0]
    new = run_reference("FusedAttention", [q, kt, v, mask],
                        {"scale": None, "scale_on": "scores", "nan_to_zero": True})[0]
    assert old[..., 2, :].isnan().all() and (new[..., 2, :] == 0).all()
    torch.testing.assert_close(new[..., :2, :], old[..., :2, :], rtol=0, atol=0)
