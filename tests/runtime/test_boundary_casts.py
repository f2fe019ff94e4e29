"""Boundary Casts: which Casts a CUDA graph replay folds into its copies, and that the folded run gives the same
outputs (the replay's conversions checked on the CPU with a stand-in graph, the real capture on a GPU)."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import kiln
from kiln.frontend.onnx import import_onnx
from kiln.runtime.boundary_casts import boundary_casts
from kiln.runtime.cuda_graph import CapturedRun

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(extra_reader: bool = False, output_read: bool = False, int_cast: bool = False) -> onnx.ModelProto:
    """x (fp32) → Cast fp16 → MatMul → Cast fp32 → y; options add a second reader of x, a reader of y, an int Cast."""
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=F16), helper.make_node("MatMul", ["xh", "w"], ["r"]),
             helper.make_node("Cast", ["r"], ["y"], to=F32)]
    outputs = [helper.make_tensor_value_info("y", F32, [2, 3])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["x"], ["nx"]))
        outputs.append(helper.make_tensor_value_info("nx", F32, [2, 3]))
    if output_read:
        nodes.append(helper.make_node("Abs", ["y"], ["ay"]))
        outputs.append(helper.make_tensor_value_info("ay", F32, [2, 3]))
    if int_cast:
        nodes.append(helper.make_node("Cast", ["r"], ["yi"], to=TensorProto.INT32))
        outputs.append(helper.make_tensor_value_info("yi", TensorProto.INT32, [2, 3]))
    w = helper.make_tensor("w", F16, [3, 3], [0.5, -1.0, 2.0, 0.25, 1.5, -0.75, 1.0, 0.125, -2.0])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [2, 3])], outputs, [w])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_the_casts_at_both_edges_fold():
    casts = boundary_casts(import_onnx(_model()))
    assert casts.inputs == {"x": torch.float16} and casts.declared == {"x": torch.float32}
    assert casts.outputs == {"y": torch.float32}
    assert len(casts.layers) == 2


def test_an_input_read_elsewhere_and_an_output_read_later_stay_in_the_graph():
    casts = boundary_casts(import_onnx(_model(extra_reader=True, output_read=True)))
    assert casts.inputs == {} and casts.outputs == {} and not casts.layers


def test_a_cast_to_an_integer_type_never_folds():
    casts = boundary_casts(import_onnx(_model(int_cast=True)))
    assert "yi" not in casts.outputs and casts.outputs == {"y": torch.float32}


class _Graph:
    """Stands in for a captured torch.cuda.CUDAGraph: replay re-runs what the capture recorded."""

    def __init__(self, fn):
        self.replay = fn


def test_a_folded_replay_matches_the_eager_run_on_the_cpu():
    """The graph's run with the Casts passed through, fed a static input in the Cast's type, then the replay's
    conversions, gives the eager run's outputs exactly, in their declared dtypes (bound outputs too)."""
    engine = kiln.build(_model().SerializeToString(), kiln.BuildConfig(device="cpu"))
    ctx = engine.create_context()
    x = torch.randn(2, 3)
    want = ctx.run({"x": x})["y"]
    run = CapturedRun.__new__(CapturedRun)
    run.casts = engine.boundary_casts
    run.inputs = {"x": torch.empty(2, 3, dtype=torch.float16)}
    run.outputs = {}
    run.graph = _Graph(lambda: run.outputs.update(ctx._graph_run(run.inputs)))
    run.graph.replay()
    assert run.outputs["y"].dtype == torch.float16  # the output Cast left to the replay
    got = run.replay({"x": x}, {})["y"]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    bound = torch.empty(2, 3)
    assert run.replay({"x": -x}, {"y": bound})["y"] is bound
    torch.testing.assert_close(bound, ctx.run({"x": -x})["y"], rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_graph_replay_with_folded_casts_equals_the_eager_engine(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 10)).eval()
    path = tmp_path / "m.onnx"
    torch.onnx.export(net, (torch.randn(2, 3, 8, 8),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"], opset_version=18)
    engine = kiln.build(str(path), kiln.BuildConfig.with_shapes({"x": (2, 3, 8, 8)}, device="cuda", fp16=True))
    assert engine.boundary_casts.inputs and engine.boundary_casts.outputs
    x = torch.randn(2, 3, 8, 8, device="cuda")
    eager = engine.create_context(max_cuda_graphs=0).run({"x": x})["y"]
    ctx = engine.create_context()
    for _ in range(3):  # capture, then replays (the fast path included)
        got = ctx.run({"x": x})["y"]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
    assert ctx.graphs.runs and not ctx.eager_reasons
    bound = torch.empty_like(eager)
    assert ctx.run({"x": x}, outputs={"y": bound})["y"] is bound
    torch.testing.assert_close(bound, eager, rtol=0, atol=0)


def _dynamic_model() -> onnx.ModelProto:
    """x (fp32, batch N) → Cast fp16 → Reshape to its own Shape (shape arithmetic: a shape program) → MatMul →
    Cast fp32 → y."""
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=F16), helper.make_node("Shape", ["xh"], ["s"]),
             helper.make_node("Reshape", ["xh", "s"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("Cast", ["m"], ["y"], to=F32)]
    w = helper.make_tensor("w", F16, [3, 2], [0.5, -1.0, 2.0, 0.25, 1.5, -0.75])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["n", 3])],
                              [helper.make_tensor_value_info("y", F32, ["n", 2])], [w])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_a_dynamic_engines_graph_run_finds_the_shape_values_its_eager_run_recorded():
    """The graph's run reads its static inputs in the Cast's type but looks its shape values up under the inputs'
    declared dtypes, where the eager run at that shape recorded them (a miss would run the host-side shape layers
    inside a capture)."""
    config = kiln.BuildConfig(device="cpu", profiles=({"x": ((1, 3), (4, 3), (8, 3))},))
    engine = kiln.build(_dynamic_model().SerializeToString(), config)
    assert engine.shape_program and engine.boundary_casts.inputs == {"x": torch.float16}
    ctx = engine.create_context()
    x = torch.randn(5, 3)
    want = ctx.run({"x": x})["y"]  # the eager run records this shape's values
    engine.shape_program.record = lambda *a: pytest.fail("the graph's run missed the recorded shape values")
    got = ctx._graph_run({"x": x.half()})["y"]
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, rtol=0, atol=0)
