"""attention_keep_mask: FusedAttention reads Hugging Face's padding mask itself (the Where(·, 0, L) and the Cast to
bool before it go, L becomes its mask_fill); a mask another layer reads stays. Outputs equal before and after, a
sequence that is padding everywhere included."""

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, attention_nodes, imported, kinds
from kiln.ir import DType
from kiln.passes.attention_keep_mask import attention_keep_mask
from kiln.passes.eliminate_dead import eliminate_dead
from kiln.passes.fuse_attention import fuse_attention

B, H, S, D = 2, 3, 8, 4
rng = np.random.default_rng(0)
MIN = float(np.finfo(np.float32).min)


def _model(low: float, pad_type=T.INT64, two_layers: bool = False, mask_out: bool = False):
    """pad [B, S] → Cast bool (unless pad is bool) → Reshape [B,1,1,S] → Where(·, 0, low) → mask; attention(q, kt,
    v, mask) once or twice; `mask_out`: the mask is an output too."""
    f = helper.make_tensor_value_info
    cast = [] if pad_type == T.BOOL else [helper.make_node("Cast", ["pad"], ["padb"], to=T.BOOL)]
    nodes = cast + [helper.make_node("Reshape", ["pad" if not cast else "padb", "shape4"], ["p4"]),
                    helper.make_node("Where", ["p4", "zero", "low"], ["m"])]
    outs = [f("m", T.FLOAT, [B, 1, 1, S])] if mask_out else []
    for i in range(2 if two_layers else 1):
        nodes += attention_nodes(i, "m")
        outs.append(f(f"y{i}", T.FLOAT, [B, H, S, D]))
    inits = [numpy_helper.from_array(np.array([B, 1, 1, S], np.int64), "shape4"),
             numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
             numpy_helper.from_array(np.array([low], np.float32), "low"),
             numpy_helper.from_array(np.array([0.5], np.float32), "c")]
    ins = [f("q", T.FLOAT, [B, H, S, D]), f("kt", T.FLOAT, [B, H, D, S]), f("v", T.FLOAT, [B, H, S, D]),
           f("pad", pad_type, [B, S])]
    g = helper.make_graph(nodes, "g", ins, outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _feeds(pad_dtype=np.int64):
    """The first sequence padded after 5 tokens, the second padding everywhere (its rows masked on every key)."""
    pad = np.ones((B, S), pad_dtype)
    pad[0, 5:] = 0
    pad[1] = 0
    return {"q": rng.standard_normal((B, H, S, D)).astype(np.float32),
            "kt": rng.standard_normal((B, H, D, S)).astype(np.float32),
            "v": rng.standard_normal((B, H, S, D)).astype(np.float32), "pad": pad}


@pytest.mark.parametrize("low,two_layers", [(-1e4, False), (MIN, True), (-100.0, False), (-np.inf, False)])
def test_the_attention_reads_the_padding_mask(low, two_layers):
    before = imported(_model(low, two_layers=two_layers))
    after, ctx = apply(before, fuse_attention, attention_keep_mask, eliminate_dead)
    attn = [l for l in after.layers if l.kind == "FusedAttention"]
    assert kinds(after) == ["Reshape"] + ["FusedAttention"] * len(attn)
    assert {l.inputs[3] for l in attn} == {after.layers[0].outputs[0]} and after.layers[0].inputs[0] == "pad"
    assert after.tensors[attn[0].inputs[3]].dtype is DType.INT64 and {l.attrs["mask_fill"] for l in attn} == {
        None if low == -np.inf else low}
    assert ctx.log["attention_keep_mask.layers"] == len(attn)
    assert_same_outputs(before, after, _feeds())


def test_a_bool_mask_needs_no_cast():
    before = imported(_model(MIN, pad_type=T.BOOL))
    after, _ = apply(before, fuse_attention, attention_keep_mask, eliminate_dead)
    assert kinds(after) == ["Reshape", "FusedAttention"]
    assert after.tensors[after.layers[1].inputs[3]].dtype is DType.BOOL
    assert_same_outputs(before, after, _feeds(bool))


def test_a_mask_read_elsewhere_stays_additive():
    before = imported(_model(MIN, mask_out=True))
    after, ctx = apply(before, fuse_attention, attention_keep_mask, eliminate_dead)
    assert "Where" in kinds(after) and "attention_keep_mask.layers" not in ctx.log
