"""load_onnx checks and shape-infers a weightless copy of the model (large initializers as typed inputs) and adopts
the inferred shapes: the same value_info and outputs as inference on the whole model, weights untouched, faster
on a model whose weights dominate it, and bad data in a large initializer still a ModelError (from the importer)."""

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from kiln.errors import ModelError
from kiln.frontend.onnx import import_onnx, load_onnx
from kiln.frontend.onnx.weightless import LARGE_BYTES, weightless

N = 1024  # 1024 x 1024 fp32 weights: 4 MiB each, far over LARGE_BYTES


def _model(layers: int = 4) -> onnx.ModelProto:
    """x [batch, N] → (MatMul W_i → Relu)×layers → Reshape to [batch, -1, 8] (a small int64 shape initializer)."""
    rng = np.random.default_rng(0)
    nodes, inits, t = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array(rng.standard_normal((N, N)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [t, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        t = f"r{i}"
    inits.append(numpy_helper.from_array(np.array([0, -1, 8], np.int64), "shape"))
    nodes.append(helper.make_node("Reshape", [t, "shape"], ["y"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", N])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "rows", "cols"])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_weightless_copy_moves_only_large_initializers():
    light = weightless(_model())
    assert [t.name for t in light.graph.initializer] == ["shape"]
    assert [i.name for i in light.graph.input] == ["x", "w0", "w1", "w2", "w3"]
    assert light.ByteSize() < LARGE_BYTES


def test_same_shapes_as_inference_on_the_whole_model(tmp_path):
    model = _model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    loaded = load_onnx(path).proto
    whole = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    key = lambda vis: {v.name: v.SerializeToString() for v in vis}  # noqa: E731
    assert key(loaded.graph.value_info) == key(whole.graph.value_info) and len(loaded.graph.value_info) == 8
    assert key(loaded.graph.output) == key(whole.graph.output)
    assert [d.dim_value for d in loaded.graph.output[0].type.tensor_type.shape.dim][1:] == [N // 8, 8]
    assert [t.SerializeToString() for t in loaded.graph.initializer] == \
        [t.SerializeToString() for t in model.graph.initializer]
    assert [i.name for i in loaded.graph.input] == ["x"]


def test_faster_than_checking_the_whole_model(tmp_path):
    """The checker and two inferences no longer copy the weights: load beats check_model + inference alone."""
    model = _model(layers=24)  # ~100 MB of weights
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    start = time.perf_counter()
    load_onnx(path)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    onnx.checker.check_model(model)
    for data_prop in (False, True):
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=data_prop)
    whole_s = time.perf_counter() - start
    assert load_s < whole_s, (load_s, whole_s)


def test_bad_data_in_a_large_initializer_is_a_model_error(tmp_path):
    model = _model(layers=1)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]  # one float short
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    loaded = load_onnx(path)  # the checker no longer reads the weights ...
    with pytest.raises(ModelError, match="does not match its dims"):
        import_onnx(loaded.proto)  # ... the importer does


def test_sizes_come_from_dims_and_type_without_the_data():
    """A large tensor whose data lives elsewhere (external data) still counts as large; strings count their bytes."""
    external = T(name="w", data_type=T.FLOAT16, dims=[512, 512], data_location=T.EXTERNAL)
    external.external_data.add(key="location", value="weights.bin")
    small_ints = numpy_helper.from_array(np.arange(16, dtype=np.int64), "s")
    words = helper.make_tensor("names", T.STRING, [2], vals=[b"a", b"b"])
    g = helper.make_graph([], "g", [], [helper.make_tensor_value_info("s", T.INT64, [16])],
                          initializer=[external, small_ints, words])
    light = weightless(helper.make_model(g))
    assert [t.name for t in light.graph.initializer] == ["s", "names"]
    assert [i.name for i in light.graph.input] == ["w"]
