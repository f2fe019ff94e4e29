"""quant/fold_quantize.py: a QuantizeLinear reading an AddLayerNorm's output becomes that layer's third output
(a transformer's add+LayerNorm feeding an int8 GEMM), with the reference, the Triton kernel and the torch
tactic all writing the same quantized copy; CPU (Triton under TRITON_INTERPRET=1)."""

import numpy as np
import torch
import triton
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.ir import DType, Layer, Network
from kiln.kernels import layernorm, quantize
from kiln.kinds import run_reference
from kiln.kinds.verify import verify_network
from kiln.quant.fold_quantize import fold_quantize
from passcheck import apply, assert_same_outputs, kinds
from test_memory_plan import _forced, _named
from test_quant_int8_residual import _cosine

RNG = np.random.default_rng(0)
D = 32


def _block() -> bytes:
    """x → MatMul → +x → LayerNorm → MatMul → +LN → LayerNorm → MatMul: two add+LayerNorms, each read by a
    MatMul (quantized) and the first also by a float Add."""
    w = {f"w{i}": (RNG.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for i in range(1, 4)}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [numpy_helper.from_array(np.ones(D, np.float32), "g"), numpy_helper.from_array(np.zeros(D, np.float32),
                                                                                            "b")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "x"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w2"], ["p"]), helper.make_node("Add", ["p", "n"], ["t"]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["n2"], axis=-1),
             helper.make_node("MatMul", ["n2", "w3"], ["y"])]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, D])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _builds(**config):
    calib = [{"x": RNG.standard_normal((8, D)).astype(np.float32)} for _ in range(4)]
    shapes = {"x": (8, D)}
    model = _block()
    quantized = kiln.build(model, kiln.BuildConfig.with_shapes(shapes, device="cpu", **config), calib_data=calib)
    return quantized, kiln.build(model, kiln.BuildConfig.with_shapes(shapes, device="cpu"))


def test_quantize_after_add_layernorm_folds_into_it():
    engine, fp32 = _builds(int8=True)
    net = engine.network
    lns = [la for la in net.layers if la.kind == "AddLayerNorm"]
    assert len(lns) == 2 and all(la.attrs["q_scale"] > 0 and la.attrs["q_dtype"] is DType.INT8 for la in lns)
    assert all(net.tensors[la.outputs[2]].dtype is DType.INT8 for la in lns)
    consumers = net.consumers()
    assert all(c.kind == "QuantGemm" for la in lns for c in consumers[la.outputs[2]])
    assert [la.inputs[0] for la in net.layers if la.kind == "QuantizeLinear"] == ["x"]  # was 3
    assert any("2 QuantizeLinear layers folded into the add+LayerNorm" in n for n in engine.build_info["notes"])
    x = RNG.standard_normal((8, D)).astype(np.float32)
    assert _cosine(engine.run({"x": x})["y"], fp32.run({"x": x})["y"]) >= 0.999


def _add_layernorm_quantize() -> Network:
    """y, s = AddLayerNorm(a, b, γ, β);  y_q = QuantizeLinear(y, 0.02);  z = DequantizeLinear(y_q): y is also an
    output (a float reader the fold must keep)."""
    net = Network("lnq")
    for name, dtype in (("a", DType.FLOAT32), ("b", DType.FLOAT32), ("y", DType.FLOAT32), ("s", DType.FLOAT32),
                        ("y_q", DType.INT8), ("z", DType.FLOAT32)):
        net.add_tensor(name, dtype, (6, D))
    g = torch.Generator().manual_seed(1)
    net.add_constant("gamma", torch.rand(D, generator=g) + 0.5)
    net.add_constant("beta", torch.randn(D, generator=g))
    net.add_constant("s_y", torch.tensor(0.02, dtype=torch.float32))
    net.inputs, net.outputs = ["a", "b"], ["z", "y"]
    net.layers = [Layer("ln", "AddLayerNorm", ["a", "b", "gamma", "beta"], ["y", "s"],
                        {"axis": -1, "epsilon": 1e-5, "stash_type": 1}),
                  Layer("q", "QuantizeLinear", ["y", "s_y"], ["y_q"], {"axis": 1, "block_size": 0, "saturate": True,
                                                                       "output_dtype": DType.INT8, "precision": None}),
                  Layer("dq", "DequantizeLinear", ["y_q", "s_y"], ["z"], {"axis": 1, "block_size": 0,
                                                                          "output_dtype": DType.FLOAT32})]
    verify_network(net)
    return net


def test_pass_folds_the_quantize_into_the_add_layernorm_before_it():
    """before ⇒ after, as the pass's docstring shows it, and the same outputs bit for bit."""
    before = _add_layernorm_quantize()
    after, ctx = apply(before, fold_quantize)
    assert kinds(before) == ["AddLayerNorm", "QuantizeLinear", "DequantizeLinear"]
    assert kinds(after) == ["AddLayerNorm", "DequantizeLinear"]
    ln = after.layers[0]
    assert ln.outputs == ["y", "s", "y_q"] and ln.attrs["q_dtype"] is DType.INT8
    assert ln.attrs["q_scale"] == float(torch.tensor(0.02, dtype=torch.float32))
    assert ctx.log["fold_quantize"] == 1 and ctx.log["fold_quantize.layers"] == 1
    feeds = {k: RNG.standard_normal((6, D)).astype(np.float32) for k in ("a", "b")}
    assert_same_outputs(before, after, feeds, rtol=0, atol=0)
    again, ctx = apply(after, fold_quantize)  # nothing left to fold
    assert kinds(again) == kinds(after) and "fold_quantize" not in ctx.log


def test_pass_leaves_a_quantize_with_a_zero_point_or_a_network_output():
    net = _add_layernorm_quantize()
    net.outputs.append("y_q")
    assert kinds(apply(net, fold_quantize)[0]) == kinds(net)
    net = _add_layernorm_quantize()
    net.add_constant("zp", torch.tensor(3, dtype=torch.int8))
    net.layers[1].inputs.append("zp")
    assert kinds(apply(net, fold_quantize)[0]) == kinds(net)


def test_folded_quantize_is_the_quantize_of_the_normalized_output():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, D, generator=g), torch.randn(6, D, generator=g)
    w, bias = torch.rand(D, generator=g) + 0.5, torch.randn(D, generator=g)
    attrs = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}
    y, s, q = run_reference("AddLayerNorm", [a, b, w, bias], attrs | {"q_scale": 0.02, "q_dtype": DType.INT8})
    want = run_reference("QuantizeLinear", [y, torch.tensor(0.02)], {"axis": 1, "block_size": 0, "saturate": True,
                                                                     "output_dtype": DType.INT8, "precision": None})
    assert torch.equal(q, want[0]) and torch.equal(y, run_reference("AddLayerNorm", [a, b, w, bias], attrs)[0])
    for dtype in (torch.float16, torch.float32):  # the Triton kernel: its own y, quantized as the Q kernel does
        ya, sa, qa = layernorm.add_layer_norm(a.to(dtype), b.to(dtype), w, bias, 1e-5, q_scale=0.02)
        yb, _ = layernorm.add_layer_norm(a.to(dtype), b.to(dtype), w, bias, 1e-5)
        assert torch.equal(ya, yb) and torch.equal(qa, quantize.quantize(ya, 0.02))
        assert torch.equal(sa, a.to(dtype) + b.to(dtype))
        block = {"BLOCK": triton.next_power_of_2(D), "num_warps": 4, "ROWS": 4}  # blocks of 4 rows, 6 rows: ragged
        assert all(torch.equal(x, z) for x, z in zip(layernorm.add_layer_norm(
            a.to(dtype), b.to(dtype), w, bias, 1e-5, block, q_scale=0.02), (ya, sa, qa)))
    _, _, q8 = layernorm.add_layer_norm(a, b, w, bias, 1e-5, q_scale=0.02, q_dtype=torch.float8_e4m3fn)
    assert q8.dtype == torch.float8_e4m3fn and torch.equal(q8.float(), quantize.quantize(
        layernorm.add_layer_norm(a, b, w, bias, 1e-5)[0], 0.02, dtype=torch.float8_e4m3fn).float())


def test_folded_engine_on_triton_and_torch_tactics_matches_the_reference():
    ref, _ = _builds(int8=True)
    x = RNG.standard_normal((8, D)).astype(np.float32)
    want = ref.run({"x": x})["y"]
    for ln_tactic in ("triton_add_layernorm", "torch_add_layernorm"):
        eng = _forced(ref, {ln_tactic} | _named("triton_int8_gemm", "triton_quantize", "view_"))
        lns = [la.name for la in eng.network.layers if la.kind == "AddLayerNorm"]
        assert {eng.tactics[n].tactic for n in lns} == {ln_tactic}
        assert _cosine(eng.run({"x": x})["y"], want) >= 0.9999


def _add_layernorm_smooth_quantize(vector_shape=(D,), extra_reader: bool = False) -> Network:
    """_add_layernorm_quantize with SmoothQuant's Mul by a per-column constant between the LayerNorm and the
    QuantizeLinear (quant/smooth.py); `extra_reader`: the Mul's product is also a network output."""
    net = _add_layernorm_quantize()
    g = torch.Generator().manual_seed(2)
    net.add_constant("inv", torch.rand(vector_shape, generator=g) * 3 + 0.1)
    net.add_tensor("y_s", DType.FLOAT32, (6, D))
    net.layers.insert(1, Layer("smooth", "Mul", ["y", "inv"], ["y_s"], {}))
    net.layers[2].inputs[0] = "y_s"
    if extra_reader:
        net.outputs.append("y_s")
    verify_network(net)
    return net


def test_smoothquant_mul_folds_with_the_quantize_into_the_add_layernorm():
    """y' = y · c quantized: the Mul and the QuantizeLinear become the LayerNorm's fifth input and third output,
    the same outputs bit for bit (the reference, and the Triton kernel against the unfused arithmetic)."""
    for shape in [(D,), (1, D)]:
        before = _add_layernorm_smooth_quantize(shape)
        after, ctx = apply(before, fold_quantize)
        assert kinds(before) == ["AddLayerNorm", "Mul", "QuantizeLinear", "DequantizeLinear"]
        assert kinds(after) == ["AddLayerNorm", "DequantizeLinear"]
        ln = after.layers[0]
        assert ln.inputs == ["a", "b", "gamma", "beta", "inv"] and ln.outputs == ["y", "s", "y_q"]
        assert ctx.log["fold_quantize.layers"] == 1
        feeds = {k: RNG.standard_normal((6, D)).astype(np.float32) for k in ("a", "b")}
        assert_same_outputs(before, after, feeds, rtol=0, atol=0)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, D, generator=g), torch.randn(6, D, generator=g)
    w, bias, c = torch.rand(D, generator=g) + 0.5, torch.randn(D, generator=g), torch.rand(D, generator=g) * 3 + 0.1
    for dtype in (torch.float16, torch.float32):
        y, _, q = layernorm.add_layer_norm(a.to(dtype), b.to(dtype), w, bias, 1e-5, q_scale=0.02,
                                           q_mul=c.to(dtype))
        assert torch.equal(q, quantize.quantize(y * c.to(dtype), 0.02, dtype=torch.int8))


def test_smoothquant_mul_with_another_reader_or_a_value_per_element_stays():
    for net in (_add_layernorm_smooth_quantize(extra_reader=True), _add_layernorm_smooth_quantize((6, D))):
        after, _ = apply(net, fold_quantize)
        assert "Mul" in kinds(after) and "QuantizeLinear" in kinds(after)


def test_smoothquant_int8_build_has_no_mul_after_its_add_layernorms(tmp_path):
    calib = [{"x": RNG.standard_normal((8, D)).astype(np.float32)} for _ in range(4)]
    engine = kiln.build(_block(), kiln.BuildConfig.with_shapes({"x": (8, D)}, device="cpu", int8=True,
                                                               smooth_alpha=0.5), calib_data=calib)
    net = engine.network
    lns = [la for la in net.layers if la.kind == "AddLayerNorm"]
    assert len(lns) == 2 and all(len(la.inputs) == 5 and la.inputs[4] in net.constants for la in lns)
    assert [la.kind for la in net.layers].count("Mul") == 1  # the input's smoothing: no LayerNorm before it
    engine.save(tmp_path / "smooth.plan")  # the fifth input survives the plan file
    x = RNG.standard_normal((8, D)).astype(np.float32)
    np.testing.assert_array_equal(kiln.load(tmp_path / "smooth.plan").run({"x": x})["y"], engine.run({"x": x})["y"])


def _attention_quantize(extra_reader: str | None = None) -> Network:
    """BERT's int8 attention tail: y = FusedAttention(q, kt, v);  t = Transpose(y, 0 2 1 3);  r = Reshape(t);
    y_q = QuantizeLinear(r, 0.01);  z = DequantizeLinear(y_q). `extra_reader`: a tensor also made an output."""
    net = Network("attq")
    b, h, s, d = 2, 4, 8, 16
    for name, dtype, shape in (("q", DType.FLOAT32, (b, h, s, d)), ("kt", DType.FLOAT32, (b, h, d, s)),
                               ("v", DType.FLOAT32, (b, h, s, d)), ("y", DType.FLOAT32, (b, h, s, d)),
                               ("t", DType.FLOAT32, (b, s, h, d)), ("r", DType.FLOAT32, (b, s, h * d)),
                               ("y_q", DType.INT8, (b, s, h * d)), ("z", DType.FLOAT32, (b, s, h * d))):
        net.add_tensor(name, dtype, shape)
    net.add_constant("shape", torch.tensor([b, s, h * d]))
    net.add_constant("s_y", torch.tensor(0.01, dtype=torch.float32))
    net.inputs, net.outputs = ["q", "kt", "v"], ["z"] + ([extra_reader] if extra_reader else [])
    quant = {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": DType.INT8, "precision": None}
    net.layers = [Layer("att", "FusedAttention", ["q", "kt", "v"], ["y"], {"scale": None, "scale_on": "scores"}),
                  Layer("tr", "Transpose", ["y"], ["t"], {"perm": [0, 2, 1, 3]}),
                  Layer("rs", "Reshape", ["t", "shape"], ["r"], {"allowzero": 0}),
                  Layer("qz", "QuantizeLinear", ["r", "s_y"], ["y_q"], quant),
                  Layer("dq", "DequantizeLinear", ["y_q", "s_y"], ["z"], {"axis": 1, "block_size": 0,
                                                                          "output_dtype": DType.FLOAT32})]
    verify_network(net)
    return net


def test_pass_folds_an_int8_quantize_through_the_head_merge_into_the_attention():
    """before ⇒ after as the docstring shows it (the views carry int8), the same outputs bit for bit; a view or
    attention output that something else reads keeps the graph as it was."""
    before = _attention_quantize()
    after, ctx = apply(before, fold_quantize)
    assert kinds(after) == ["FusedAttention", "Transpose", "Reshape", "DequantizeLinear"]
    att, tr, rs = after.layers[:3]
    assert att.attrs["q_scale"] == float(torch.tensor(0.01)) and att.attrs["q_dtype"] is DType.INT8
    assert tr.inputs[0] == att.outputs[0] and rs.inputs[0] == tr.outputs[0] and rs.outputs == ["y_q"]
    assert {after.tensors[t].dtype for t in (att.outputs[0], tr.outputs[0], "y_q")} == {DType.INT8}
    assert ctx.log["fold_quantize.layers"] == 1
    g = torch.Generator().manual_seed(2)
    feeds = {"q": torch.randn(2, 4, 8, 16, generator=g).numpy(), "kt": torch.randn(2, 4, 16, 8, generator=g).numpy(),
             "v": torch.randn(2, 4, 8, 16, generator=g).numpy()}
    assert_same_outputs(before, after, feeds, rtol=0, atol=0)
    for reader in ("t", "r", "y"):
        kept = _attention_quantize(reader)
        assert kinds(apply(kept, fold_quantize)[0]) == kinds(kept), reader


def test_int8_bert_build_folds_the_attention_output_quantize():
    """A tiny BERT built int8 on the CPU: every attention writes int8 for its output projection, and the engine
    still agrees with the float one."""
    import tempfile
    from pathlib import Path

    from models.export import export
    from models.text import LastHidden, tiny_bert

    model = LastHidden(tiny_bert(layers=2), pooled=False)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    args = (ids, torch.ones(2, 16, dtype=torch.int64), torch.zeros(2, 16, dtype=torch.int64))
    path = export(model, args, Path(tempfile.mkdtemp()) / "bert.onnx", dynamo=False, input_names=names,
                  output_names=["y"])
    feeds = [dict(zip(names, (RNG.integers(0, 500, (2, 16)), np.ones((2, 16), np.int64), np.zeros((2, 16), np.int64))))
             for _ in range(4)]
    shapes = {n: (2, 16) for n in names}
    engine = kiln.build(str(path), kiln.BuildConfig.with_shapes(shapes, device="cpu", int8=True), calib_data=feeds)
    attention = [layer for layer in engine.network.layers if layer.kind == "FusedAttention"]
    assert len(attention) == 2 and all(a.attrs.get("q_scale") for a in attention)
    assert all(engine.network.tensors[a.outputs[0]].dtype is DType.INT8 for a in attention)
    float_engine = kiln.build(str(path), kiln.BuildConfig.with_shapes(shapes, device="cpu"))
    got, want = engine.create_context().run(feeds[0])["y"], float_engine.create_context().run(feeds[0])["y"]
    assert _cosine(np.asarray(got), np.asarray(want)) > 0.999
