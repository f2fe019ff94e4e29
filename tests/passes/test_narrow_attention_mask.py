"""narrow_attention_mask: FusedAttention reads a Hugging Face style padding mask at [B, 1, 1, S] (Reshape → And with
an all-True constant → Expand → Where(·, 0, -inf)) instead of the [B, 1, Sq, S] tensor the chain builds; a
constant that is not all True, or a branch that is not one element, keeps the mask at [B, 1, Sq, S].
Outputs equal before and after."""

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, attention_nodes, imported, kinds
from kiln.passes.eliminate_dead import eliminate_dead
from kiln.passes.fuse_attention import fuse_attention
from kiln.passes.narrow_attention_mask import narrow_attention_mask

B, H, S, D = 2, 3, 8, 4
rng = np.random.default_rng(0)


def _rows_from_range(bound: int) -> list:
    """rows = Unsqueeze(Range(0, S, 1), [0, 1, 3]) ≥ bound, as dynamic-shape exports compute the query rows' mask
    (bound 0)."""
    return [helper.make_node("Shape", ["q"], ["qs"], start=2, end=3), helper.make_node("Squeeze", ["qs"], ["n"]),
            helper.make_node("Range", ["start", "n", "one"], ["r"]),
            helper.make_node("Unsqueeze", ["r", "axes"], ["r4"]),
            helper.make_node("GreaterOrEqual", ["r4", "zero_i"], ["rows"])], [
        numpy_helper.from_array(np.array(0, np.int64), "start"), numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([0, 1, 3], np.int64), "axes"),
        numpy_helper.from_array(np.array(bound, np.int64), "zero_i")]


def _model(rows_const, neg_branch: np.ndarray, two_layers: bool = False):
    """pad [B, S] bool → [B,1,1,S] → And(rows [1,1,S,1]: a constant, or ("range", start)) → Expand [B,1,S,S] →
    Where(·, 0, neg_branch) → mask; attention(q, kt, v, mask) once, or twice reading the same mask."""
    f = helper.make_tensor_value_info
    rows_nodes, rows_inits = _rows_from_range(rows_const[1]) if isinstance(rows_const, tuple) else ([], [])
    nodes = rows_nodes + [helper.make_node("Reshape", ["pad", "shape4"], ["p4"]),
                          helper.make_node("And", ["rows", "p4"], ["a"]),
             helper.make_node("Expand", ["a", "full"], ["e"]), helper.make_node("Where", ["e", "zero", "neg"], ["m"])]
    outs = []
    for i in range(2 if two_layers else 1):
        nodes += attention_nodes(i, "m")
        outs.append(f(f"y{i}", T.FLOAT, [B, H, S, D]))
    inits = [numpy_helper.from_array(np.array([B, 1, 1, S], np.int64), "shape4"),
             numpy_helper.from_array(np.array([B, 1, S, S], np.int64), "full"),
             *([] if rows_nodes else [numpy_helper.from_array(rows_const, "rows")]), *rows_inits,
             numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
             numpy_helper.from_array(neg_branch, "neg"), numpy_helper.from_array(np.array([0.5], np.float32), "c")]
    ins = [f("q", T.FLOAT, [B, H, S, D]), f("kt", T.FLOAT, [B, H, D, S]), f("v", T.FLOAT, [B, H, S, D]),
           f("pad", T.BOOL, [B, S])]
    g = helper.make_graph(nodes, "g", ins, outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _feeds():
    pad = np.ones((B, S), bool)
    pad[0, 5:] = False
    pad[1, 2:] = False
    return {"q": rng.standard_normal((B, H, S, D)).astype(np.float32),
            "kt": rng.standard_normal((B, H, D, S)).astype(np.float32),
            "v": rng.standard_normal((B, H, S, D)).astype(np.float32), "pad": pad}


ALL_TRUE = np.ones((1, 1, S, 1), bool)
NEG = np.array([-1e4], np.float32)


@pytest.mark.parametrize("rows,two_layers", [(ALL_TRUE, False), (ALL_TRUE, True), (("range", 0), False)])
def test_padding_mask_is_read_narrow(rows, two_layers):
    before = imported(_model(rows, NEG, two_layers))
    after, ctx = apply(before, fuse_attention, narrow_attention_mask, eliminate_dead)
    attn = [l for l in after.layers if l.kind == "FusedAttention"]
    assert len(attn) == (2 if two_layers else 1) and len({l.inputs[3] for l in attn}) == 1
    assert after.tensors[attn[0].inputs[3]].shape == (B, 1, 1, S)
    assert "And" not in kinds(after) and "Expand" not in kinds(after) and kinds(after).count("Where") == 1
    assert ctx.log["narrow_attention_mask.layers"] == len(attn)
    assert_same_outputs(before, after, _feeds())


@pytest.mark.parametrize("rows,neg", [(np.eye(S, dtype=bool)[None, None, :, :1], NEG),  # not all True
                                      (("range", 1), NEG),  # arange(0, S) ≥ 1 is not
                                      (ALL_TRUE, np.full((1, 1, 1, S), -1e4, np.float32))])  # a branch of S values
def test_other_chains_stay(rows, neg):
    before = imported(_model(rows, neg))
    after, _ = apply(before, fuse_attention, narrow_attention_mask, eliminate_dead)
    attn = next(l for l in after.layers if l.kind == "FusedAttention")
    assert after.tensors[attn.inputs[3]].shape[-2] != 1 and "And" in kinds(after)  # S, or unknown from the Range
    assert_same_outputs(before, after, _feeds())
