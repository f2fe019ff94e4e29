"""fuse_embedding: token and segment lookups, a position constant (or lookup) and the LayerNorm after their sum
become one EmbedLayerNorm with the unfused network's results; sums taken in another association, a sum read
elsewhere, a lookup of a computed table and one that does not repeat over the output's rows stay unfused."""

import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.fuse_embedding import fuse_embedding
from kiln.passes.fuse_layernorm import fuse_layernorm

rng = np.random.default_rng(0)
B, S, H, V = 2, 5, 16, 30


def _c(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(sums, *, pos_shape=(1, S, H), pos_lookup=False, extra_outputs=(), table_input=False):
    """ids, tt → Gather(W), Gather(Tt) [and Gather(P, pos) or constant P] summed as `sums` (pairs of names) →
    LayerNormalization → z."""
    nodes = [helper.make_node("Gather", ["W", "ids"], ["g0"]), helper.make_node("Gather", ["Tt", "tt"], ["g1"])]
    inits = [_c("Tt", rng.standard_normal((2, H))), _c("gamma", rng.uniform(0.5, 1.5, H)),
             _c("beta", rng.standard_normal(H))]
    inputs = [helper.make_tensor_value_info(n, T.INT64, [B, S]) for n in ("ids", "tt")]
    if table_input:
        inputs.append(helper.make_tensor_value_info("W", T.FLOAT, [V, H]))
    else:
        inits.append(_c("W", rng.standard_normal((V, H))))
    if pos_lookup:
        nodes.append(helper.make_node("Gather", ["P", "pos"], ["g2"]))
        inits += [_c("P", rng.standard_normal((S, H))), _c("pos", np.arange(S).reshape(pos_shape[:-1]), np.int64)]
    else:
        inits.append(_c("g2", rng.standard_normal(pos_shape)))
    for a, b, out in sums:
        nodes.append(helper.make_node("Add", [a, b], [out]))
    nodes.append(helper.make_node("LayerNormalization", [sums[-1][2], "gamma", "beta"], ["z"], axis=-1,
                                  epsilon=1e-5))
    outputs = [helper.make_tensor_value_info(n, T.FLOAT, [B, S, H]) for n in ("z", *extra_outputs)]
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return imported(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _feeds(net):
    feeds = {"ids": rng.integers(-V, V, (B, S)), "tt": rng.integers(0, 2, (B, S))}
    if "W" in net.inputs:
        feeds["W"] = rng.standard_normal((V, H)).astype(np.float32)
    return feeds


BERT = [("g0", "g1", "e"), ("e", "g2", "s")]


@pytest.mark.parametrize("sums, pos_lookup, pos_shape", [
    (BERT, False, (1, S, H)),  # BERT's static export: positions folded to [1, S, H]
    (BERT, False, (S, H)),
    ([("g1", "g0", "e"), ("g2", "e", "s")], False, (1, S, H)),  # operands of either Add either way round
    (BERT, True, (1, S, H)),  # positions as a [1, S] lookup (a dynamic export)
    ([("g0", "g2", "s")], False, (1, S, H)),  # no segments
])
def test_embedding_sum_and_layernorm_become_one_layer(sums, pos_lookup, pos_shape):
    net = _model(sums, pos_shape=pos_shape, pos_lookup=pos_lookup)
    after, ctx = apply(net, fuse_layernorm, fuse_embedding)
    assert [k for k in kinds(after) if k != "Gather"] == ["EmbedLayerNorm"]
    fused = next(l for l in after.layers if l.kind == "EmbedLayerNorm")
    assert fused.inputs[:2] == ["ids", "W"] or fused.inputs[2:4] == ["ids", "W"]
    lookups = (2 if len(sums) == 2 else 1) + pos_lookup
    assert ctx.log["fuse_embedding.layers"] == lookups + len(sums)  # the layers besides the LayerNorm it replaced
    assert_same_outputs(net, after, _feeds(net), atol=1e-5)


@pytest.mark.parametrize("case", ["reassociated", "sum read", "table computed", "does not repeat"])
def test_what_stays_unfused(case):
    kw = {}
    sums = BERT
    if case == "reassociated":  # (g0 + P) + g1: the constant is not the last term
        sums = [("g0", "g2", "e"), ("e", "g1", "s")]
    elif case == "sum read":
        kw["extra_outputs"] = ("e",)
    elif case == "table computed":
        kw["table_input"] = True
    else:
        kw["pos_shape"] = (B, 1, H)  # one row an example, repeated along the sequence: not rows that repeat
    net = _model(sums, **kw)
    after, _ = apply(net, fuse_layernorm, fuse_embedding)
    assert "EmbedLayerNorm" not in kinds(after)
    assert_same_outputs(net, after, _feeds(net), atol=1e-5)
