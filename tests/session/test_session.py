"""kiln.InferenceSession against onnxruntime.InferenceSession on the same model (CPU)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import kiln
from kiln.errors import ConfigError, InputError, KilnError
from kiln.session import InferenceSession, model_metadata_proto

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)


def tiny_model() -> onnx.ModelProto:
    """a [batch, 4] float, b [batch, 3] float → y = a @ W + b (float), n = argmax(y, axis 1) (int64)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"]),
         helper.make_node("ArgMax", ["y"], ["n"], axis=1, keepdims=0)],
        "tiny_graph",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, ["batch"])],
        [helper.make_tensor("W", TensorProto.FLOAT, W.shape, W.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="session-test",
                              producer_version="1.2", doc_string="a tiny model", model_version=7)
    model.ir_version = 8
    helper.set_model_props(model, {"author": "kiln tests"})
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("session") / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    return path


@pytest.fixture(scope="module")
def sessions(model_path):
    ref = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    sess = InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return ref, sess


def feeds(batch: int = 5) -> dict[str, np.ndarray]:
    return {"a": RNG.standard_normal((batch, 4)).astype(np.float32),
            "b": RNG.standard_normal((batch, 3)).astype(np.float32)}


def describe(args) -> list[tuple]:
    return [(a.name, list(a.shape), a.type) for a in args]


def test_lazy_export():
    assert kiln.InferenceSession is InferenceSession
    assert "InferenceSession" in kiln.__all__


def test_inputs_outputs_and_providers_match_onnxruntime(sessions):
    ref, sess = sessions
    assert describe(sess.get_inputs()) == describe(ref.get_inputs())
    assert describe(sess.get_outputs()) == describe(ref.get_outputs())
    assert describe(sess.get_inputs()) == [("a", ["batch", 4], "tensor(float)"), ("b", ["batch", 3], "tensor(float)")]
    assert sess.get_outputs()[1].type == "tensor(int64)"
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_modelmeta_matches_onnxruntime(sessions):
    ref, sess = sessions
    want, got = ref.get_modelmeta(), sess.get_modelmeta()
    for attr in ("producer_name", "graph_name", "domain", "description", "version", "custom_metadata_map"):
        assert getattr(got, attr) == getattr(want, attr), attr
    assert got.producer_name == "session-test" and got.graph_name == "tiny_graph" and got.version == 7


def test_metadata_read_without_the_graph():
    m = model_metadata_proto(tiny_model().SerializeToString())
    assert m.producer_name == "session-test" and m.producer_version == "1.2" and not m.HasField("graph")
    assert {p.key: p.value for p in m.metadata_props} == {"author": "kiln tests"}


def test_run_matches_onnxruntime(sessions):
    ref, sess = sessions
    for batch in (1, 5):
        x = feeds(batch)
        want, got = ref.run(None, x), sess.run(None, x)
        assert len(got) == 2 and all(isinstance(g, np.ndarray) for g in got)
        for w, g in zip(want, got):
            assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])


def test_run_subset_in_given_order(sessions):
    ref, sess = sessions
    x = feeds()
    want, got = ref.run(["n", "y"], x), sess.run(["n", "y"], x)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    [y] = sess.run(["y"], x)
    np.testing.assert_allclose(y, want[1], rtol=1e-5, atol=1e-5)


def test_run_takes_torch_and_returns_numpy(sessions):
    ref, sess = sessions
    x = feeds()
    got = sess.run(None, {k: torch.from_numpy(v) for k, v in x.items()}, None)
    assert all(isinstance(g, np.ndarray) for g in got)
    np.testing.assert_allclose(got[0], ref.run(["y"], x)[0], rtol=1e-5, atol=1e-5)


def test_model_bytes_and_shapes_option(model_path, sessions):
    ref, _ = sessions
    sess = InferenceSession(model_path.read_bytes(), shapes={"a": (2, 4), "b": (2, 3)}, device="cpu")
    assert sess.get_modelmeta().producer_name == "session-test"
    x = feeds(2)
    np.testing.assert_allclose(sess.run(["y"], x)[0], ref.run(["y"], x)[0], rtol=1e-5, atol=1e-5)


def test_plan_round_trip(model_path, sessions, tmp_path):
    ref, _ = sessions
    engine = kiln.build(str(model_path), kiln.BuildConfig(device="cpu"))
    plan = tmp_path / "tiny.plan"
    engine.save(plan)
    sess = InferenceSession(str(plan), providers=["CPUExecutionProvider"])
    assert describe(sess.get_inputs()) == describe(ref.get_inputs())
    assert describe(sess.get_outputs()) == describe(ref.get_outputs())
    assert sess.get_modelmeta().graph_name == "tiny_graph"
    x = feeds()
    want, got = ref.run(None, x), sess.run(None, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ConfigError, match="build options"):
        InferenceSession(str(plan), fp16=True)


def test_iobinding_into_buffers(sessions):
    ref, sess = sessions
    x = feeds(3)
    want = ref.run(None, x)
    io = sess.io_binding()
    io.bind_input("a", x["a"])
    io.bind_input("b", torch.from_numpy(x["b"]))
    y_buf = np.zeros((3, 3), np.float32)
    n_buf = torch.zeros(3, dtype=torch.int64)
    io.bind_output("n", n_buf)
    io.bind_output("y", y_buf)
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(y_buf, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(n_buf.numpy(), want[1])
    outs = io.get_outputs()
    assert outs[0] is n_buf and outs[1] is y_buf  # in binding order, the caller's buffers
    cpu = io.copy_outputs_to_cpu()
    np.testing.assert_array_equal(cpu[0], want[1])
    np.testing.assert_allclose(cpu[1], want[0], rtol=1e-5, atol=1e-5)
    assert cpu[1] is not y_buf


def test_iobinding_allocated_outputs(sessions):
    ref, sess = sessions
    x = feeds(2)
    io = sess.io_binding()
    for k, v in x.items():
        io.bind_cpu_input(k, v)
    with pytest.raises(InputError, match="run_with_iobinding"):
        io.get_outputs()
    io.bind_output("y", "cpu")  # ONNX Runtime's positional device_type
    sess.run_with_iobinding(io)
    [y] = io.copy_outputs_to_cpu()
    np.testing.assert_allclose(y, ref.run(["y"], x)[0], rtol=1e-5, atol=1e-5)
    io.clear_binding_outputs()
    sess.run_with_iobinding(io)  # nothing bound: every output
    assert [o.shape for o in io.get_outputs()] == [(2, 3), (2,)]


def test_iobinding_errors(sessions):
    _, sess = sessions
    io = sess.io_binding()
    with pytest.raises(InputError, match=r"unknown input name 'x'.*\['a', 'b'\]"):
        io.bind_input("x", np.zeros((1, 4), np.float32))
    with pytest.raises(InputError, match=r"unknown output name 'z'.*\['y', 'n'\]"):
        io.bind_output("z")
    with pytest.raises(ConfigError, match="raw device pointers"):
        io.bind_input("a", "cpu", 0, np.float32, [1, 4], 0)
    x = feeds(2)
    for k, v in x.items():
        io.bind_input(k, v)
    io.bind_output("y", np.zeros((3, 3), np.float32))
    with pytest.raises(InputError, match=r"buffer is float32\[3, 3\], but the output is float32\[2, 3\]"):
        sess.run_with_iobinding(io)


def test_errors_are_kiln_errors(sessions, model_path):
    _, sess = sessions
    x = feeds()
    with pytest.raises(InputError, match=r"unknown output name 'z'; the model's outputs are \['y', 'n'\]") as e:
        sess.run(["y", "z"], x)
    assert isinstance(e.value, KilnError)
    with pytest.raises(InputError, match=r"missing \['a'\].*unexpected \['x'\]") as e:
        sess.run(None, {"x": x["a"], "b": x["b"]})
    assert isinstance(e.value, KilnError)
    with pytest.raises(ConfigError, match="'ROCMExecutionProvider' is not one kiln runs on") as e:
        InferenceSession(str(model_path), providers=["ROCMExecutionProvider"])
    assert isinstance(e.value, KilnError)
    with pytest.raises(ConfigError, match="disagree"):
        InferenceSession(str(model_path), device="cuda", providers=["CPUExecutionProvider"])
    with pytest.raises(InputError, match="output_names must be a list"):
        sess.run("y", x)


def test_gpu_provider_without_gpu_falls_back_to_cpu(model_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.warns(RuntimeWarning, match="no CUDA GPU"):
        sess = InferenceSession(str(model_path), providers=[("CUDAExecutionProvider", {})])
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_one_session_shared_between_threads(sessions):
    from concurrent.futures import ThreadPoolExecutor

    ref, sess = sessions
    xs = [feeds(b) for b in (1, 2, 3, 4, 5, 6)]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda x: sess.run(["y"], x)[0], xs))
    for x, g in zip(xs, got):
        np.testing.assert_allclose(g, ref.run(["y"], x)[0], rtol=1e-5, atol=1e-5)
