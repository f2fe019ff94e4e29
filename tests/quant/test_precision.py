"""Precision assignment (kiln.quant): which layers run in fp16/bf16, where casts go, how constants are
converted; and ResNet-50, ViT and BERT in fp16/bf16 against the fp32 engine on the CPU reference backend."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T, helper, numpy_helper

import kiln
from kiln.target import detect
from kiln.config import BuildConfig
from kiln.runtime import Engine
from kiln.errors import ConfigError, InputError
from kiln.ir import DType
from kiln.passes import PassContext, default_passes, run_passes
from kiln.quant import apply_precision
from kiln.quant.casts import holds_all, remove_redundant_casts
from passcheck import imported, kinds, run

F16, BF16, F32 = DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32
BY_FLAG = {"fp16": F16, "bf16": BF16}
rng = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=18):
    """A graph from nodes; inputs/outputs are {name: (elem_type, shape)}, inits numpy arrays by name."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                          [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
                          initializer=[numpy_helper.from_array(v, n) for n, v in dict(inits).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _reduced(net, config):
    """A precision-assigned copy of `net` and the notes."""
    net = copy.deepcopy(net)
    return net, apply_precision(net, config)


def _run_all(net, feeds):
    """Every tensor's runtime value, checking each has the dtype the IR declares."""
    names = {o for layer in net.layers for o in layer.outputs if o}
    got = Engine(net, BuildConfig(device="cpu"), detect("cpu")).create_context().run(feeds, keep=names)
    for n in names:
        v = got[n]
        assert (DType.from_torch if isinstance(v, torch.Tensor) else DType.from_numpy)(v.dtype) \
            is net.tensors[n].dtype, n
    return got


def _cast_layers(net):
    return [layer for layer in net.layers if layer.kind == "Cast"]


def _conv_relu():
    nodes = [helper.make_node("Conv", ["x", "w", "bias"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return imported(_model(nodes, {"x": (T.FLOAT, [1, 3, 8, 8])}, {"y": (T.FLOAT, [1, 4, 8, 8])},
                           {"w": _randn(4, 3, 3, 3), "bias": _randn(4)}))


def test_fp16_keeps_io_types_and_converts_weights():
    net32 = _conv_relu()
    net, notes = _reduced(net32, BuildConfig(fp16=True))
    assert kinds(net) == ["Cast", "Conv", "Relu", "Cast"]
    cast_in, conv, relu, cast_out = net.layers
    assert (conv.precision, relu.precision, cast_in.precision) == (F16, F16, None)
    assert cast_in.inputs == ["x"] and conv.inputs[0] == cast_in.outputs[0]
    assert cast_out.outputs == ["y"] and cast_out.inputs == relu.outputs
    assert net.tensors["x"].dtype is F32 and net.tensors["y"].dtype is F32 and net.tensors["c"].dtype is F16
    assert {str(v.dtype) for v in net.constants.values()} == {"torch.float16"} and len(net.constants) == 2
    assert notes == ["precision: of 2 layers, 2 in float16; 2 casts inserted, 0 redundant casts removed, "
                     "2 constants converted"]
    x = _randn(1, 3, 8, 8)
    got, want = _run_all(net, {"x": x})["y"], run(net32, {"x": x})["y"]
    # fp16 inputs and weights (2^-11 relative rounding each), fp32 accumulation over 27 products
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_io_in_reduced_type_without_keep_io():
    net, _ = _reduced(_conv_relu(), BuildConfig(bf16=True, keep_io_precision=False))
    assert kinds(net) == ["Conv", "Relu"]
    assert net.tensors["x"].dtype is BF16 and net.tensors["y"].dtype is BF16
    x = torch.randn(1, 3, 8, 8)
    assert _run_all(net, {"x": x.bfloat16()})["y"].dtype == torch.bfloat16
    with pytest.raises(InputError, match="dtype"):
        run(net, {"x": x.numpy()})


def test_one_cast_per_tensor_and_type_shared_by_readers():
    """x: read by two fp16 layers (one cast) and by Sin, which is not on the allow-list (no cast);
    Sin's fp32 result is read by two fp16 layers (one cast)."""
    nodes = [helper.make_node(op, ins, [out], name=name) for op, ins, out, name in (
        ("Relu", ["x"], "a", "relu"), ("Sigmoid", ["x"], "s", "sig"), ("Sin", ["x"], "b", "sin"),
        ("Add", ["a", "b"], "c", "add"), ("Mul", ["c", "b"], "d", "mul"), ("Mul", ["d", "s"], "y", "y"))]
    net32 = imported(_model(nodes, {"x": (T.FLOAT, [4, 5])}, {"y": (T.FLOAT, [4, 5])}))
    net, _ = _reduced(net32, BuildConfig(fp16=True))
    casts = _cast_layers(net)
    assert [(c.inputs[0], c.attrs["to"]) for c in casts] == [("x", F16), ("b", F16), (casts[2].inputs[0], F32)]
    by_name = {layer.name: layer for layer in net.layers}
    assert by_name["sin"].precision is None and by_name["sin"].inputs == ["x"] and net.tensors["b"].dtype is F32
    assert by_name["relu"].inputs == by_name["sig"].inputs == casts[0].outputs
    assert by_name["add"].inputs[1] == by_name["mul"].inputs[1] == casts[1].outputs[0]
    x = _randn(4, 5)
    np.testing.assert_allclose(_run_all(net, {"x": x})["y"], run(net32, {"x": x})["y"], rtol=5e-3, atol=5e-3)


def test_constant_shared_with_fp32_reader_is_duplicated_and_others_converted_once():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="mm16"),
             helper.make_node("MatMul", ["x", "w"], ["q"], name="mm32"),
             helper.make_node("MatMul", ["p", "v"], ["r"], name="mm_v1"),
             helper.make_node("MatMul", ["r", "v"], ["s"], name="mm_v2"),
             helper.make_node("Add", ["s", "q"], ["y"], name="add")]
    net32 = imported(_model(nodes, {"x": (T.FLOAT, [2, 4])}, {"y": (T.FLOAT, [2, 4])},
                            {"w": _randn(4, 4), "v": _randn(4, 4)}))
    net, _ = _reduced(net32, BuildConfig(fp16=True, layer_precisions={"mm32": "fp32"}))
    by_name = {layer.name: layer for layer in net.layers}
    assert by_name["mm32"].precision is None and by_name["mm32"].inputs == ["x", "w"]
    w16 = by_name["mm16"].inputs[1]
    assert w16 != "w" and net.tensors["w"].dtype is F32 and net.tensors[w16].dtype is F16
    assert torch.equal(net.constants[w16], net.constants["w"].half())
    assert by_name["mm_v1"].inputs[1] == by_name["mm_v2"].inputs[1] == "v" and net.tensors["v"].dtype is F16
    assert sorted(net.constants) == sorted(["w", "v", w16])
    x = _randn(2, 4)
    np.testing.assert_allclose(_run_all(net, {"x": x})["y"], run(net32, {"x": x})["y"], rtol=1e-2, atol=1e-2)


def test_integer_and_shape_tensors_untouched():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["shape"], name="shape"),
             helper.make_node("Add", ["shape", "one"], ["shape1"], name="int_add"),
             helper.make_node("Reshape", ["r", "flat"], ["f"], name="reshape"),
             helper.make_node("Gather", ["f", "idx"], ["y"], name="gather", axis=1)]
    net32 = imported(_model(nodes, {"x": (T.FLOAT, [2, 3, 4])},
                            {"y": (T.FLOAT, [2, 2]), "shape1": (T.INT64, [3])},
                            {"one": np.array([1], np.int64), "flat": np.array([2, 12], np.int64),
                             "idx": np.array([0, 5], np.int64)}))
    net, _ = _reduced(net32, BuildConfig(fp16=True))
    by_name = {layer.name: layer for layer in net.layers}
    assert by_name["shape"].inputs == ["r"] and by_name["shape"].precision is None  # reads the fp16 tensor as is
    assert by_name["int_add"].precision is None and net.tensors["shape1"].dtype is DType.INT64
    assert by_name["reshape"].precision is F16 and by_name["reshape"].inputs[1] == "flat"
    assert all(net.tensors[c].dtype is DType.INT64 for c in ("one", "flat", "idx"))
    assert len(_cast_layers(net)) == 2  # x in, y out
    x = _randn(2, 3, 4)
    got, want = _run_all(net, {"x": x}), run(net32, {"x": x})
    np.testing.assert_array_equal(got["shape1"], want["shape1"])
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-3)  # Relu and gathers: one fp16 rounding


def test_layer_precision_overrides():
    net32 = _conv_relu()
    net, _ = _reduced(net32, BuildConfig(layer_precisions={"relu": "bf16"}))  # no global flag: only relu
    assert [layer.precision for layer in net.layers] == [None, None, BF16, None]
    net, _ = _reduced(net32, BuildConfig(fp16=True, layer_precisions={"conv": "fp32"}))
    assert [(layer.kind, layer.precision) for layer in net.layers] == [
        ("Conv", None), ("Cast", None), ("Relu", F16), ("Cast", None)]
    with pytest.raises(ConfigError, match="no layer 'relu1'.*did you mean 'relu'"):
        apply_precision(copy.deepcopy(net32), BuildConfig(fp16=True, layer_precisions={"relu1": "fp32"}))
    with pytest.raises(ConfigError, match="one of fp32"):
        apply_precision(copy.deepcopy(net32), BuildConfig(layer_precisions={"conv": "int8"}))
    net32.layers[1].origin.append("bn")  # as if fused: the ONNX node's name finds its layer
    net, _ = _reduced(net32, BuildConfig(fp16=True, layer_precisions={"bn": "fp32"}))
    assert [layer.precision for layer in net.layers] == [None, F16, None, None]


def _fused(nodes, inits):
    """A default-optimized network of nodes reading x: float32[2, 3], writing y."""
    model = _model(nodes, {"x": (T.FLOAT, [2, 3])}, {"y": (T.FLOAT, [2, 3])}, inits)
    return run_passes(imported(model), default_passes(), PassContext())


def test_pointwise_chain_follows_its_steps_kinds():
    half = np.array(0.5, np.float32)
    net32 = _fused([helper.make_node("Mul", ["x", "half"], ["a"]), helper.make_node("Tanh", ["a"], ["y"])],
                   {"half": half})
    net, _ = _reduced(net32, BuildConfig(fp16=True))
    assert kinds(net) == ["Cast", "PointwiseChain", "Cast"] and net.layers[1].precision is F16
    x = _randn(2, 3)
    np.testing.assert_allclose(_run_all(net, {"x": x})["y"], np.tanh(x * 0.5), rtol=1e-3, atol=1e-3)
    with_cast = _fused([helper.make_node("Greater", ["x", "zero"], ["g"]),
                        helper.make_node("Cast", ["g"], ["c"], to=T.FLOAT),
                        helper.make_node("Mul", ["x", "c"], ["y"], name="mul")], {"zero": np.zeros((), np.float32)})
    assert kinds(with_cast) == ["PointwiseChain"]
    net, notes = _reduced(with_cast, BuildConfig(fp16=True))
    assert kinds(net) == ["PointwiseChain"] and net.layers[0].precision is None
    assert notes == ["precision: of 1 layers, none reduced; 0 casts inserted, 0 redundant casts removed, "
                     "0 constants converted"]
    with pytest.raises(ConfigError, match="fp32-only"):
        apply_precision(net, BuildConfig(layer_precisions={net.layers[0].name: "fp16"}))


def test_layer_precision_refuses_denied_kinds():
    net32 = imported(_model([helper.make_node("Cast", ["x"], ["y"], name="cast", to=T.DOUBLE)],
                            {"x": (T.FLOAT, [3])}, {"y": (T.DOUBLE, [3])}))
    with pytest.raises(ConfigError, match="'cast' \\(Cast\\) cannot run in float16"):
        apply_precision(net32, BuildConfig(layer_precisions={"cast": "fp16"}))


def test_model_cast_to_the_reduced_type_disappears():
    """y = Relu(x) becomes fp16, so the model's own Cast(y → fp16) is a no-op and is bypassed."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["h"], name="to_half", to=T.FLOAT16),
             helper.make_node("Neg", ["h"], ["y"], name="neg")]
    net, notes = _reduced(imported(_model(nodes, {"x": (T.FLOAT, [3])}, {"y": (T.FLOAT16, [3])})),
                          BuildConfig(fp16=True))
    assert kinds(net) == ["Cast", "Relu", "Neg"] and net.layers[2].inputs == ["r"]
    assert "1 redundant casts removed" in notes[0]
    assert _run_all(net, {"x": np.array([-1, 2, 3], np.float32)})["y"].tolist() == [0, -2, -3]


def test_exact_round_trip_casts_go_lossy_ones_stay():
    exact = imported(_model([helper.make_node("Cast", ["x"], ["w"], to=T.FLOAT),
                             helper.make_node("Cast", ["w"], ["n"], to=T.FLOAT16),
                             helper.make_node("Relu", ["n"], ["y"])],
                            {"x": (T.FLOAT16, [3])}, {"y": (T.FLOAT16, [3])}))
    assert remove_redundant_casts(exact) == 1 and kinds(exact) == ["Relu"] and exact.layers[0].inputs == ["x"]
    lossy = imported(_model([helper.make_node("Cast", ["x"], ["n"], to=T.FLOAT16),
                             helper.make_node("Cast", ["n"], ["w"], to=T.FLOAT),
                             helper.make_node("Relu", ["w"], ["y"])],
                            {"x": (T.FLOAT, [3])}, {"y": (T.FLOAT, [3])}))
    assert remove_redundant_casts(lossy) == 0 and kinds(lossy) == ["Cast", "Cast", "Relu"]
    assert holds_all(F32, F16) and holds_all(F32, BF16) and not holds_all(F16, BF16) and not holds_all(BF16, F16)
    assert holds_all(DType.INT32, DType.UINT16) and not holds_all(DType.INT32, DType.UINT32)


def test_out_of_range_constants_are_clamped():
    """transformers' mask constant finfo(float32).min would be -inf in fp16, and 0 * -inf is NaN."""
    nodes = [helper.make_node("Mul", ["x", "big"], ["y"], name="mul")]
    net, notes = _reduced(imported(_model(nodes, {"x": (T.FLOAT, [3])}, {"y": (T.FLOAT, [3])},
                                          {"big": np.array([-3.4e38, np.inf, 2.0], np.float32)})),
                          BuildConfig(fp16=True))
    assert net.constants["big"].tolist() == [-65504.0, float("inf"), 2.0]
    assert "1 constant values" in notes[1]
    assert _run_all(net, {"x": np.array([0, 1, 1], np.float32)})["y"].tolist() == [0, float("inf"), 2]


def test_resize_coordinates_stay_fp32():
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="linear")]
    net32 = imported(_model(nodes, {"x": (T.FLOAT, [1, 1, 3, 3])}, {"y": (T.FLOAT, [1, 1, 4, 4])},
                            {"scales": np.array([1, 1, 4 / 3, 4 / 3], np.float32)}))
    net, _ = _reduced(net32, BuildConfig(fp16=True))
    resize = next(layer for layer in net.layers if layer.kind == "Resize")
    assert resize.precision is F16 and net.tensors["scales"].dtype is F32 and len(_cast_layers(net)) == 2
    x = _randn(1, 1, 3, 3)
    np.testing.assert_allclose(_run_all(net, {"x": x})["y"], run(net32, {"x": x})["y"], rtol=5e-3, atol=5e-3)


def test_flag_notes_and_nothing_to_do():
    net32 = _conv_relu()
    net, notes = _reduced(net32, BuildConfig(tf32=True, int8=True, fp8=True))
    assert str(net) == str(net32)
    # --int8 and --fp8 are the quantization stage's (quant/int8_stage.py), before this pass
    assert len(notes) == 1 and "TF32" in notes[0]


def test_reduced_plan_round_trips(tmp_path):
    net, _ = _reduced(_conv_relu(), BuildConfig(fp16=True))
    engine = Engine(net, BuildConfig(device="cpu", fp16=True), detect("cpu"))
    loaded = kiln.load(engine.save(tmp_path / "m.plan"))
    assert [layer.precision for layer in loaded.network.layers] == [layer.precision for layer in net.layers]
    assert loaded.network.constants["w"].dtype == torch.float16
    x = _randn(1, 3, 8, 8)
    np.testing.assert_array_equal(loaded.run({"x": x})["y"], engine.run({"x": x})["y"])


# -- whole models: reduced engine vs fp32 engine ----------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name → (optimized fp32 network, feeds): ResNet-50 and ViT-B/16 at 32x32, tiny BERT at seq 16."""
    from models.export import export
    from models.text import LastHidden, tiny_bert
    from models.vision import ResNet50, ViT, randomize_bn

    out, nets = tmp_path_factory.mktemp("precision"), {}
    torch.manual_seed(0)
    image = torch.randn(1, 3, 32, 32)
    for name, model in (("resnet50", randomize_bn(ResNet50())),
                        ("vit", ViT(image_size=32).eval())):
        path = export(model, (image,), out / f"{name}.onnx", dynamo=False, input_names=["input"],
                      output_names=["logits"])
        nets[name] = (path, {"input": image.numpy()})
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 8:] = 0  # padding exercises the -3.4e38 mask constant
    bert_in = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(2, 16, dtype=torch.int64)}
    path = export(LastHidden(tiny_bert()), tuple(bert_in.values()), out / "bert.onnx", dynamo=False,
                  input_names=list(bert_in), output_names=["last_hidden_state", "pooler_output"])
    nets["bert"] = (path, {k: v.numpy() for k, v in bert_in.items()})
    result = {}
    for name, (path, feeds) in nets.items():
        net = run_passes(imported(onnx.load(str(path))), default_passes(), PassContext())
        result[name] = (net, feeds, run(net, feeds))
    return result


# The cosine floors; and max |err| / max |ref| within ~20 roundings of each type's unit
# (fp16 2^-11 ≈ 4.9e-4, bf16 2^-8 ≈ 3.9e-3): measured at most 1.4e-3 (fp16) and 1.2e-2 (bf16).
@pytest.mark.slow
@pytest.mark.parametrize("flag, min_cos, max_rel", [("fp16", 0.999, 1e-2), ("bf16", 0.99, 8e-2)])
@pytest.mark.parametrize("name", ["resnet50", "vit", "bert"])
def test_model_accuracy(models, name, flag, min_cos, max_rel):
    net32, feeds, want = models[name]
    net, _ = _reduced(net32, BuildConfig(**{flag: True}))
    computed = [layer for layer in net.layers if layer.kind != "Cast"
                and any(o and net.tensors[o].dtype.is_float for o in layer.outputs)]
    assert computed and all(layer.precision is BY_FLAG[flag] for layer in computed)
    got = _run_all(net, feeds)
    for out, w in want.items():
        g = got[out]
        assert g.dtype == w.dtype and g.shape == w.shape, out
        a, b = w.astype(np.float64).ravel(), g.astype(np.float64).ravel()
        cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
        rel = np.abs(a - b).max() / np.abs(a).max()
        print(f"{name} {flag} {out}: cosine {cos:.6f}, max |err| / max |ref| {rel:.2e}")
        assert cos >= min_cos and rel <= max_rel, (out, cos, rel)

