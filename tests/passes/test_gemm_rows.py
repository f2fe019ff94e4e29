"""gemm_rows: Reshape to rows → Gemm → Reshape back to the same leading dims becomes a FusedGemm on the leading
dims (no merge of them); a Gemm that scales, or rows split into other dims, stays."""

import numpy as np
from onnx import TensorProto as T, helper, numpy_helper

from passcheck import apply, assert_same_outputs, imported, kinds
from kiln.passes.gemm_rows import gemm_rows

rng = np.random.default_rng(0)
S, B, H, D, N = 5, 4, 2, 8, 6


def _model(out_shape=(S, B, N), alpha=1.0, trans_b=1):
    """x [S, B, H, D] → Reshape [S·B, H·D] → Gemm(W, c) → Reshape `out_shape` → y."""
    w = (N, H * D) if trans_b else (H * D, N)
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["m"]),
             helper.make_node("Gemm", ["m", "w", "c"], ["g"], transB=trans_b, alpha=alpha),
             helper.make_node("Reshape", ["g", "back"], ["y"])]
    inits = [numpy_helper.from_array(np.array([S * B, H * D], np.int64), "rows"),
             numpy_helper.from_array(np.array(out_shape, np.int64), "back"),
             numpy_helper.from_array(rng.standard_normal(w).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "c")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [S, B, H, D])],
                          [helper.make_tensor_value_info("y", T.FLOAT, list(out_shape))], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _feeds():
    return {"x": rng.standard_normal((S, B, H, D)).astype(np.float32)}


def test_rows_keep_their_leading_dims():
    for trans_b in (0, 1):
        before = imported(_model(trans_b=trans_b))
        after, ctx = apply(before, gemm_rows)
        assert kinds(after) == ["Reshape", "FusedGemm"] and ctx.log["gemm_rows.layers"] == 1
        reshape, gemm = after.layers
        assert after.tensors[reshape.outputs[0]].shape == (S, B, H * D) and gemm.outputs == ["y"]
        assert gemm.attrs == {"trans_b": bool(trans_b), "activation": "none", "activation_params": []}
        assert_same_outputs(before, after, _feeds())


def test_scaled_or_regrouped_rows_stay():
    for model in (_model(alpha=2.0), _model(out_shape=(B, S, N)), _model(out_shape=(S * B // 2, 2, N))):
        before = imported(model)
        after, _ = apply(before, gemm_rows)
        assert kinds(after) == ["Reshape", "Gemm", "Reshape"]
