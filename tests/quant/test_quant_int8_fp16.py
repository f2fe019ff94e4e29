"""quant/int8_fp16.py: with fp16 float layers, quantized layers write fp16 and QuantizeLinear reads fp16 (no casts)."""

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

import kiln

RNG = np.random.default_rng(0)


def _mlp() -> bytes:
    w = {n: (RNG.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
         for n, s in (("w1", (16, 32)), ("w2", (32, 16)), ("w3", (16, 8)))}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [numpy_helper.from_array(np.ones(16, np.float32), "g"),
              numpy_helper.from_array(np.zeros(16, np.float32), "b")]
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["m"]),
         helper.make_node("LayerNormalization", ["m", "g", "b"], ["n"], axis=-1),
         helper.make_node("MatMul", ["n", "w3"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_int8_fp16_build_has_no_casts_around_quantized_layers():
    model = _mlp()
    calib = [{"x": RNG.standard_normal((4, 16)).astype(np.float32)} for _ in range(4)]
    shapes = {"x": (4, 16)}
    mixed = kiln.build(model, kiln.BuildConfig.with_shapes(shapes, device="cpu", int8=True, fp16=True),
                       calib_data=calib)
    plain = kiln.build(model, kiln.BuildConfig.with_shapes(shapes, device="cpu", int8=True), calib_data=calib)
    net = mixed.network
    producers = net.producers()
    kinds = [layer.kind for layer in net.layers]
    assert kinds.count("QuantGemm") == 3 and any("int8 with fp16: 1 quantized layers write fp16" in n
                                                 for n in mixed.build_info["notes"])
    for layer in net.layers:
        if layer.kind == "QuantizeLinear":
            src = producers.get(layer.inputs[0])
            assert src is None or src.kind != "Cast"
            assert layer.attrs["precision"] is kiln.ir.DType.FLOAT32 or net.tensors[layer.inputs[0]].dtype \
                is kiln.ir.DType.FLOAT32
        if layer.kind == "Cast":
            assert producers.get(layer.inputs[0]) is None or producers[layer.inputs[0]].kind != "QuantGemm"
    fp16_out = [layer for layer in net.layers if layer.kind == "QuantGemm" and layer.attrs.get("out_dtype")]
    assert len(fp16_out) == 1 and net.tensors[fp16_out[0].outputs[0]].dtype is kiln.ir.DType.FLOAT16
    assert sum(k == "Cast" for k in kinds) <= 2  # the network's fp32 input and output only
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    a = torch.as_tensor(np.asarray(mixed.create_context().run({"x": x})["y"])).double().flatten()
    b = torch.as_tensor(np.asarray(plain.create_context().run({"x": x})["y"])).double().flatten()
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.999
