"""If, Loop and Scan against ONNX Runtime: bodies, captured outer values, nesting, and what kiln refuses."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE

ORT_IR = 10
F = T.FLOAT


def model(nodes, inputs, outputs, opset=17, initializers=()):
    """A model of `nodes`; inputs/outputs are value infos (helper.make_*_value_info)."""
    graph = h.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=ORT_IR)


def same(got, want, rtol=1e-4, atol=1e-5) -> None:
    """Equal structure (lists for sequences, None for empty optionals), dtypes and shapes; close values."""
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{got!r} != {want!r}"
        for g, w in zip(got, want):
            same(g, w, rtol, atol)
    elif want is None:
        assert got is None
    else:
        assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{got.dtype}{got.shape} != {want.dtype}{want.shape}"
        if want.dtype.kind in "fc":
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(got, want)


def check_model(m: onnx.ModelProto, feeds: dict, **tol) -> kiln.Engine:
    """Run `m` in kiln and ONNX Runtime and compare every output; returns the engine."""
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    engine = kiln.build(m, kiln.BuildConfig(device=DEVICE))
    got = engine.create_context().run(feeds)
    for out, w in zip(m.graph.output, want):
        same(got[out.name], w, **tol)
    return engine


def vi(name, elem=F, shape=None):
    return h.make_tensor_value_info(name, elem, shape)


def add_body(name, a, b, out):
    return h.make_node("Add", [a, b], [out], name=name)


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_different_captures_per_branch(cond):
    then = h.make_graph([h.make_node("Mul", ["x", "w"], ["t"])], "then", [], [vi("t", F, [3])])
    other = h.make_graph([h.make_node("Sub", ["x", "v"], ["e"])], "else", [], [vi("e", F, [3])])
    m = model([h.make_node("Add", ["x", "x"], ["w"]), h.make_node("Neg", ["x"], ["v"]),
               h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("c", T.BOOL, []), vi("x", F, [3])], [vi("y", F, [3])])
    engine = check_model(m, {"c": np.array(cond), "x": np.random.rand(3).astype(np.float32)})
    layer = next(l for l in engine.network.layers if l.kind == "If")
    assert layer.inputs == ["c", "x", "w", "v"]  # captures are explicit inputs, in both branches
    assert layer.attrs["then_branch"].inputs == layer.attrs["else_branch"].inputs == ["x", "w", "v"]


def _loop_body():
    """carried s += x * i; scan output s; continue while s < 10."""
    nodes = [h.make_node("Cast", ["i"], ["fi"], to=F), h.make_node("Mul", ["x", "fi"], ["xi"]),
             h.make_node("Add", ["s_in", "xi"], ["s_out"]), h.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
             h.make_node("Less", ["total", "limit"], ["cond_out"]), h.make_node("Add", ["s_out", "zero"], ["scan"])]
    return h.make_graph(nodes, "body", [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("s_in", F, [2])],
                        [vi("cond_out", T.BOOL, []), vi("s_out", F, [2]), vi("scan", F, [2])],
                        initializer=[onnx.numpy_helper.from_array(np.zeros(2, np.float32), "zero")])


@pytest.mark.parametrize("trip, cond", [(5, True), (100, True), (0, True), (3, False)])
def test_loop_carried_scan_outputs_and_capture(trip, cond):
    m = model([h.make_node("Loop", ["M", "c", "s0"], ["s", "scans"], body=_loop_body())],
              [vi("M", T.INT64, []), vi("c", T.BOOL, []), vi("s0", F, [2]), vi("x", F, [2]), vi("limit", F, [])],
              [vi("s", F, [2]), vi("scans", F, [None, 2])])
    check_model(m, {"M": np.array(trip), "c": np.array(cond), "s0": np.ones(2, np.float32),
                    "x": np.array([0.5, 1.0], np.float32), "limit": np.array(10, np.float32)})


def test_loop_without_trip_count_runs_until_cond():
    m = model([h.make_node("Loop", ["", "c", "s0"], ["s", "scans"], body=_loop_body())],
              [vi("c", T.BOOL, []), vi("s0", F, [2]), vi("x", F, [2]), vi("limit", F, [])],
              [vi("s", F, [2]), vi("scans", F, [None, 2])])
    check_model(m, {"c": np.array(True), "s0": np.zeros(2, np.float32), "x": np.array([1, 2], np.float32),
                    "limit": np.array(20, np.float32)})


def test_nested_if_in_loop_captures_through_two_levels():
    inner_then = h.make_graph([h.make_node("Add", ["s_in", "w"], ["a"])], "t", [], [vi("a", F, [2])])
    inner_else = h.make_graph([h.make_node("Sub", ["s_in", "w"], ["b"])], "e", [], [vi("b", F, [2])])
    body = h.make_graph([h.make_node("Less", ["i", "two"], ["small"]),
                         h.make_node("If", ["small"], ["s_out"], then_branch=inner_then, else_branch=inner_else),
                         h.make_node("Or", ["cond_in", "cond_in"], ["cond_out"])],
                        "body", [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("s_in", F, [2])],
                        [vi("cond_out", T.BOOL, []), vi("s_out", F, [2])])
    m = model([h.make_node("Loop", ["M", "", "s0"], ["s"], body=body)],
              [vi("M", T.INT64, []), vi("s0", F, [2]), vi("w", F, [2])], [vi("s", F, [2])],
              initializers=[onnx.numpy_helper.from_array(np.array(2, np.int64), "two")])
    engine = check_model(m, {"M": np.array(5), "s0": np.zeros(2, np.float32), "w": np.array([1, 3], np.float32)})
    loop = engine.network.layers[-1]
    assert loop.inputs[-1] == "w" and loop.attrs["captures"] == 1


def test_scan9_axes_and_directions():
    body = h.make_graph([h.make_node("Add", ["acc", "a"], ["acc_out"]), h.make_node("Mul", ["acc_out", "b"], ["y"])],
                        "body", [vi("acc", F, [3]), vi("a", F, [3]), vi("b", F, [3])],
                        [vi("acc_out", F, [3]), vi("y", F, [3])])
    node = h.make_node("Scan", ["init", "xa", "xb"], ["final", "ys"], body=body, num_scan_inputs=2,
                       scan_input_axes=[1, 0], scan_input_directions=[1, 0],
                       scan_output_axes=[-1], scan_output_directions=[1])
    m = model([node], [vi("init", F, [3]), vi("xa", F, [3, 4]), vi("xb", F, [4, 3])],
              [vi("final", F, [3]), vi("ys", F, [3, 4])])
    rng = np.random.default_rng(0)
    check_model(m, {"init": rng.random(3, np.float32), "xa": rng.random((3, 4), np.float32),
                    "xb": rng.random((4, 3), np.float32)})


def test_scan8_batched():
    body = h.make_graph([h.make_node("Add", ["acc", "x"], ["acc_out"]), h.make_node("Mul", ["acc_out", "x"], ["y"])],
                        "body", [vi("acc", F, [2]), vi("x", F, [2])], [vi("acc_out", F, [2]), vi("y", F, [2])])
    node = h.make_node("Scan", ["", "init", "xs"], ["final", "ys"], body=body, num_scan_inputs=1, directions=[1])
    m = model([node], [vi("init", F, [3, 2]), vi("xs", F, [3, 4, 2])], [vi("final", F, [3, 2]), vi("ys", F, [3, 4, 2])],
              opset=8)
    rng = np.random.default_rng(1)
    feeds = {"init": rng.random((3, 2), np.float32), "xs": rng.random((3, 4, 2), np.float32)}
    engine = kiln.build(m, kiln.BuildConfig(device=DEVICE))  # ORT no longer runs opset 8: check by hand
    got = engine.run(feeds)
    acc = feeds["init"].copy()
    ys = np.zeros_like(feeds["xs"])
    for k, t in enumerate(reversed(range(4))):  # scan outputs are in iteration order
        acc = acc + feeds["xs"][:, t]
        ys[:, k] = acc * feeds["xs"][:, t]
    np.testing.assert_allclose(got["final"], acc, rtol=1e-6)
    np.testing.assert_allclose(got["ys"], ys, rtol=1e-6)


def test_loop_without_trip_count_or_condition_is_refused():
    body = h.make_graph([h.make_node("Not", ["cond_in"], ["cond_out"]), h.make_node("Neg", ["v"], ["v_out"])], "body",
                        [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("v", F, [1])],
                        [vi("cond_out", T.BOOL, []), vi("v_out", F, [1])])
    m = model([h.make_node("Loop", ["", "", "x"], ["y"], body=body)], [vi("x", F, [1])], [vi("y", F, [1])])
    with pytest.raises(UnsupportedOpError, match="never ends"):
        kiln.build(m, kiln.BuildConfig(device=DEVICE))


def test_scan8_sequence_lens_is_refused():
    body = h.make_graph([h.make_node("Add", ["acc", "x"], ["acc_out"])], "body",
                        [vi("acc", F, [2]), vi("x", F, [2])], [vi("acc_out", F, [2])])
    node = h.make_node("Scan", ["lens", "init", "xs"], ["final"], body=body, num_scan_inputs=1)
    m = model([node], [vi("lens", T.INT64, [3]), vi("init", F, [3, 2]), vi("xs", F, [3, 4, 2])],
              [vi("final", F, [3, 2])], opset=8)
    with pytest.raises(UnsupportedOpError, match="sequence_lens"):
        kiln.build(m, kiln.BuildConfig(device=DEVICE))


def test_unsupported_op_inside_a_body_is_named():
    then = h.make_graph([h.make_node("NoSuchOp", ["x"], ["t"], name="deep")], "then", [], [vi("t", F, [1])])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [1])])
    m = model([h.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)],
              [vi("c", T.BOOL, []), vi("x", F, [1])], [vi("y", F, [1])])
    with pytest.raises(UnsupportedOpError, match="node 'deep' in subgraph 'then_branch' of node 'branch'.*NoSuchOp"):
        kiln.build(m, kiln.BuildConfig(device=DEVICE))
