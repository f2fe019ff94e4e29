"""Sequence and optional ops against ONNX Runtime, including sequence and optional graph inputs and outputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from test_controlflow import check_model, model, vi

import kiln
from kiln.errors import InputError
from opcheck import DEVICE

F = T.FLOAT


def seq(name, elem=F, shape=None):
    return h.make_tensor_sequence_value_info(name, elem, shape)


def opt_seq(name, elem=F):
    element = h.make_sequence_type_proto(h.make_tensor_type_proto(elem, None))
    return h.make_value_info(name, h.make_optional_type_proto(element))


RNG = np.random.default_rng(0)


def test_construct_insert_erase_at_length():
    nodes = [h.make_node("SequenceConstruct", ["a", "b"], ["s0"]),
             h.make_node("SequenceInsert", ["s0", "c", "front"], ["s1"]),
             h.make_node("SequenceInsert", ["s1", "a"], ["s2"]),
             h.make_node("SequenceErase", ["s2", "back"], ["s3"]),
             h.make_node("SequenceAt", ["s3", "back"], ["last"]),
             h.make_node("SequenceLength", ["s3"], ["n"])]
    m = model(nodes, [vi(n, F, [2]) for n in "abc"] + [vi("front", T.INT64, []), vi("back", T.INT64, [])],
              [seq("s3"), vi("last", F, [2]), vi("n", T.INT64, [])])
    check_model(m, {"a": RNG.random(2, np.float32), "b": RNG.random(2, np.float32), "c": RNG.random(2, np.float32),
                    "front": np.array(0), "back": np.array(-2)})


def test_empty_sequence_then_insert_and_concat():
    nodes = [h.make_node("SequenceEmpty", [], ["e"], dtype=F), h.make_node("SequenceInsert", ["e", "x"], ["s1"]),
             h.make_node("SequenceInsert", ["s1", "x"], ["s2"]),
             h.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=1),
             h.make_node("ConcatFromSequence", ["s2"], ["stack"], axis=-1, new_axis=1)]
    m = model(nodes, [vi("x", F, [2, 3])], [vi("cat", F, [2, 6]), vi("stack", F, [2, 3, 2])])
    check_model(m, {"x": RNG.random((2, 3), np.float32)})


@pytest.mark.parametrize("split, attrs", [(None, {"axis": 1}), (None, {"axis": -1, "keepdims": 0}),
                                          (np.array(2), {"axis": 1}), (np.array([1, 4]), {"axis": 1})])
def test_split_to_sequence(split, attrs):
    inputs, feeds = [vi("x", F, [2, 5])], {"x": RNG.random((2, 5), np.float32)}
    if split is not None:
        inputs.append(vi("split", T.INT64, list(split.shape)))
        feeds["split"] = split
    m = model([h.make_node("SplitToSequence", list(feeds), ["s"], **attrs)], inputs, [seq("s")])
    check_model(m, feeds)


def test_sequence_input_identity_through_sequence_map_with_capture():
    body = h.make_graph([h.make_node("Add", ["e", "t"], ["a"]), h.make_node("Mul", ["a", "w"], ["y"]),
                         h.make_node("Shape", ["e"], ["shape"])], "body",
                        [vi("e", F, None), vi("t", F, [1])], [vi("y", F, None), vi("shape", T.INT64, [None])])
    m = model([h.make_node("SequenceMap", ["xs", "t"], ["ys", "shapes"], body=body)],
              [seq("xs"), vi("t", F, [1]), vi("w", F, [1])], [seq("ys"), seq("shapes", T.INT64)])
    check_model(m, {"xs": [RNG.random(n, np.float32) for n in (1, 3, 2)], "t": np.ones(1, np.float32),
                    "w": np.full(1, 2, np.float32)})


@pytest.mark.parametrize("given", [True, False])
def test_optional_has_and_get_element(given):
    then = h.make_graph([h.make_node("OptionalGetElement", ["o"], ["got"])], "then", [], [seq("got")])
    other = h.make_graph([h.make_node("SequenceConstruct", ["x"], ["made"])], "else", [], [seq("made")])
    nodes = [h.make_node("OptionalHasElement", ["o"], ["has"]),
             h.make_node("If", ["has"], ["s"], then_branch=then, else_branch=other)]
    m = model(nodes, [opt_seq("o"), vi("x", F, [2])], [vi("has", T.BOOL, []), seq("s")], opset=18)
    x = RNG.random(2, np.float32)
    check_model(m, {"o": [x, x + 1] if given else None, "x": x})


def test_optional_of_a_tensor_and_an_empty_one():
    empty = h.make_node("Optional", [], ["none"], type=h.make_tensor_type_proto(F, [2]))
    nodes = [h.make_node("Optional", ["x"], ["some"]), empty,
             h.make_node("OptionalHasElement", ["some"], ["has_some"]),
             h.make_node("OptionalHasElement", ["none"], ["has_none"]),
             h.make_node("OptionalGetElement", ["some"], ["y"])]
    m = model(nodes, [vi("x", F, [2])], [vi("has_some", T.BOOL, []), vi("has_none", T.BOOL, []), vi("y", F, [2])],
              opset=18)
    check_model(m, {"x": RNG.random(2, np.float32)})


def test_loop_grows_a_sequence():
    body = h.make_graph([h.make_node("Or", ["cond_in", "cond_in"], ["cond_out"]),
                         h.make_node("Unsqueeze", ["i", "axes"], ["i1"]), h.make_node("Cast", ["i1"], ["f"], to=F),
                         h.make_node("SequenceInsert", ["s_in", "f"], ["s_out"])], "body",
                        [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), seq("s_in")],
                        [vi("cond_out", T.BOOL, []), seq("s_out")])
    m = model([h.make_node("Constant", [], ["axes"], value_ints=[0]), h.make_node("SequenceEmpty", [], ["e"]),
               h.make_node("Loop", ["M", "", "e"], ["s"], body=body)], [vi("M", T.INT64, [])], [seq("s")])
    check_model(m, {"M": np.array(4)})


def test_bad_sequence_feed_is_an_input_error():
    m = model([h.make_node("SequenceLength", ["xs"], ["n"])], [seq("xs")], [vi("n", T.INT64, [])])
    engine = kiln.build(m, kiln.BuildConfig(device=DEVICE))
    assert engine.run({"xs": [np.zeros(2, np.float32)] * 3})["n"] == 3
    with pytest.raises(InputError, match="expected a list"):
        engine.run({"xs": np.zeros(2, np.float32)})
    with pytest.raises(InputError, match="dtype float32"):
        engine.run({"xs": [np.zeros(2, np.int32)]})
