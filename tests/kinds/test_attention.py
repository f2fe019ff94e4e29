"""Attention-family kinds against ONNX Runtime (or ONNX's reference evaluator where ORT lacks
the op or opset), randomized; plus the clear errors for unsupported attribute values."""

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx import import_onnx
from kiln.kinds import run_reference
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def check_ref(op, inputs, attrs=None, *, rtol=1e-4, atol=1e-5, **kw):
    """Like check_op, but against onnx's ReferenceEvaluator (ORT has no kernel for these opsets)."""
    model = make_model(op, inputs, attrs, **kw)
    want = ReferenceEvaluator(model).run(None, inputs)
    got = kiln.build(model, kiln.BuildConfig(device=DEVICE)).create_context().run(inputs)
    for w, o in zip(want, model.graph.output):
        g = got[o.name]
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{op} output {o.name}")


def qkv(b=2, hq=4, hkv=4, sq=3, skv=5, d=8, dv=8):
    return {"q": f32(b, hq, sq, d), "k": f32(b, hkv, skv, d), "v": f32(b, hkv, skv, dv)}


@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}, {"scale": 0.3}, {"softcap": 2.0},
                                   {"is_causal": 1, "softcap": 1.5, "scale": 0.2}])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_attention_4d(attrs, heads):
    check_op("Attention", qkv(hq=heads[0], hkv=heads[1], dv=6), attrs, opset=23)


@pytest.mark.parametrize("mask_shape", [(3, 5), (2, 1, 3, 5), (4, 3, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks(mask_shape, dtype, causal):
    inputs = qkv(skv=5)
    if dtype == np.bool_:
        mask = rng.random(mask_shape) < 0.7
        mask[..., 0] = True  # keep every row attending something: ORT gives NaN for fully-masked rows
    else:
        mask = f32(*mask_shape)
    check_op("Attention", {**inputs, "mask": mask}, {"is_causal": causal}, opset=23)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_past_present_and_qk_output(mode):
    inputs = {**qkv(sq=2, skv=2), "mask": f32(2, 6), "past_k": f32(2, 4, 4, 8), "past_v": f32(2, 4, 4, 8)}
    # no is_causal here: ORT's mode-2 output writes its causal mask as -FLT_MAX where the spec says -inf
    check_op("Attention", inputs, {"qk_matmul_output_mode": mode, "softcap": 3.0}, opset=23, n_outputs=4)


def test_attention_3d_gqa_with_past():
    inputs = {"q": f32(2, 3, 32), "k": f32(2, 3, 16), "v": f32(2, 3, 12), "mask": f32(3, 7),
              "past_k": f32(2, 2, 4, 8), "past_v": f32(2, 2, 4, 6)}
    check_op("Attention", inputs, {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1}, opset=23, n_outputs=3)


def test_attention_fp16_softmax_precision():
    inputs = {k: v.astype(np.float16) for k, v in
              {**qkv(sq=2, skv=2), "mask": f32(2, 6), "past_k": f32(2, 4, 4, 8), "past_v": f32(2, 4, 4, 8)}.items()}
    # fp16 storage between the matmuls: tolerance of a few fp16 ulps (eps 9.8e-4)
    check_op("Attention", inputs, {"softmax_precision": 1, "qk_matmul_output_mode": 3}, opset=23, n_outputs=4,
             rtol=5e-3, atol=5e-3)


def test_attention_plan_round_trip(tmp_path):
    """The softmax_precision attribute (a DType) survives saving and loading a plan."""
    inputs = {k: v.astype(np.float16) for k, v in qkv().items()}
    model = make_model("Attention", inputs, {"softmax_precision": 1}, opset=23)
    kiln.build(model, kiln.BuildConfig(device=DEVICE)).save(tmp_path / "a.plan")
    got = kiln.load(tmp_path / "a.plan").create_context().run(inputs)["out0"]
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3)  # fp16 storage: a few ulps


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_nonpad_kv_seqlen(causal):
    inputs = {**qkv(sq=2, skv=6), "mask": f32(2, 4), "nonpad": np.array([4, 6], np.int64)}
    check_ref("Attention", inputs, {"is_causal": causal}, opset=24,
              input_order=["q", "k", "v", "mask", "", "", "nonpad"])


@pytest.mark.parametrize("window", [(2, -1), (1, 2), (0, 0)])
def test_attention_sliding_window(window):
    attrs = {"left_window_size": window[0], "right_window_size": window[1], "is_causal": int(window[1] <= 0)}
    check_ref("Attention", {**qkv(sq=4, skv=6), "past_k": f32(2, 4, 2, 8), "past_v": f32(2, 4, 2, 8)},
              attrs, opset=25, n_outputs=3, input_order=["q", "k", "v", "", "past_k", "past_v"])


def test_attention_fully_masked_row_is_zero():
    mask = np.ones((3, 7), bool)
    mask[1] = False
    inputs = {**qkv(), "mask": mask, "past_k": f32(2, 4, 2, 8), "past_v": f32(2, 4, 2, 8)}
    check_ref("Attention", inputs, {"qk_matmul_output_mode": 3}, opset=23, n_outputs=4)


def test_attention_reference_matches_sdpa():
    """The reference is what a future SDPA/flash tactic must reproduce: check the plain GQA causal case."""
    q, k, v = (torch.from_numpy(a) for a in qkv(hq=4, hkv=2, sq=5, skv=5).values())
    attrs = {"scale": None, "is_causal": True, "q_num_heads": None, "kv_num_heads": None, "softcap": 0.0,
             "softmax_precision": None, "qk_matmul_output_mode": 0, "left_window_size": -1, "right_window_size": -1}
    got = run_reference("Attention", [q, k, v], attrs)[0]
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"interleaved": 1}, {"rotary_embedding_dim": 4},
                                   {"interleaved": 1, "rotary_embedding_dim": 4}])
def test_rotary_embedding(attrs):
    half = attrs.get("rotary_embedding_dim", 8) // 2
    inputs = {"x": f32(2, 4, 3, 8), "cos": f32(10, half), "sin": f32(10, half),
              "pos": rng.integers(0, 10, (2, 3)).astype(np.int64)}
    check_op("RotaryEmbedding", inputs, attrs, opset=23)


def test_rotary_embedding_3d_without_position_ids():
    inputs = {"x": f32(2, 3, 32), "cos": f32(2, 3, 4), "sin": f32(2, 3, 4)}
    check_op("RotaryEmbedding", inputs, {"num_heads": 4}, opset=23)


@pytest.mark.parametrize("rule,heads,decay,beta", [
    ("linear", (2, 2), None, None), ("gated", (2, 2), "per_dim", None), ("gated", (2, 2), "per_head", None),
    ("delta", (2, 2), None, "per_head"), ("gated_delta", (4, 2), "per_dim", "per_head"),
    ("gated_delta", (4, 1), "per_head", "shared")])
def test_linear_attention(rule, heads, decay, beta):
    hq, hkv = heads
    inputs = {"q": f32(2, 3, hq * 4), "k": f32(2, 3, hkv * 4) / 2, "v": f32(2, 3, hkv * 4), "past": f32(2, hkv, 4, 4)}
    order = ["q", "k", "v", "past", "", ""]
    if decay:
        inputs["decay"] = -np.abs(f32(2, 3, hkv * 4 if decay == "per_dim" else hkv))
        order[4] = "decay"
    if beta:
        inputs["beta"] = rng.random((2, 3, hkv if beta == "per_head" else 1)).astype(np.float32)
        order[5] = "beta"
    check_ref("LinearAttention", inputs, {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule},
              opset=27, n_outputs=2, input_order=order)


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("extras", [(), ("bias",), ("bias", "past")])
def test_causal_conv_with_state(activation, extras):
    inputs = {"x": f32(2, 4, 6), "w": f32(4, 1, 3)}
    if "bias" in extras:
        inputs["bias"] = f32(4)
    if "past" in extras:
        inputs["past"] = f32(2, 4, 2)
    order = ["x", "w", "bias" if "bias" in extras else "", "past" if "past" in extras else ""]
    check_ref("CausalConvWithState", inputs, {"activation": activation}, opset=27, n_outputs=2, input_order=order)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_swiglu(alpha):
    check_ref("SwiGLU", {"a": f32(3, 5), "b": f32(3, 5)}, {"alpha": alpha}, opset=28)


@pytest.mark.parametrize("op,inputs,attrs,opset,outputs,error", [
    ("Attention", qkv(), {"qk_matmul_output_mode": 4}, 23, [(2, 4, 3, 8)], UnsupportedOpError),
    ("Attention", qkv(), {"softmax_precision": 7}, 23, [(2, 4, 3, 8)], UnsupportedOpError),
    ("Attention", {"q": f32(2, 3, 8), "k": f32(2, 3, 8), "v": f32(2, 3, 8)}, {}, 23, [(2, 3, 8)], ModelError),
    ("Attention", qkv(hq=3, hkv=2), {}, 23, [(2, 3, 3, 8)], ModelError),
    ("LinearAttention", {"q": f32(1, 2, 4), "k": f32(1, 2, 4), "v": f32(1, 2, 4)},
     {"q_num_heads": 1, "kv_num_heads": 1, "update_rule": "mamba"}, 27, [(1, 2, 4), (1, 1, 4, 4)], UnsupportedOpError),
    ("CausalConvWithState", {"x": f32(1, 2, 4), "w": f32(2, 1, 2)}, {"activation": "relu"}, 27,
     [(1, 2, 4), (1, 2, 1)], UnsupportedOpError),
])
def test_unsupported_attributes_are_clear_errors(op, inputs, attrs, opset, outputs, error):
    """The importer's own checks, reached directly: the loader's ONNX inference rejects some of these first."""
    h = onnx.helper
    outs = [h.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, shape) for i, shape in enumerate(outputs)]
    node = h.make_node(op, list(inputs), [o.name for o in outs], name="n", **attrs)
    ins = [h.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in inputs.items()]
    model = h.make_model(h.make_graph([node], "g", ins, outs), opset_imports=[h.make_opsetid("", opset)])
    with pytest.raises(error, match="'n'"):
        import_onnx(model)
