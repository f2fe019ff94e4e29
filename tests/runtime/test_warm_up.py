"""Engine._warm: the warm-up's runs at many shapes record every shape and stop at the first shape the model refuses
(with a load note, never an exception)."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.builder.specialize import every_point
from kiln.config import ShapeRange
from kiln.runtime.shape_program import input_signature
from test_shape_program import DIM, HEADS, PROFILE, model  # noqa: F401 - the fixture


@pytest.fixture(scope="module")
def engine(model):  # noqa: F811
    return kiln.build(str(model), kiln.BuildConfig(device="cpu", profiles=({"x": PROFILE},)))


def _points(lo: int, hi: int) -> list[tuple]:
    return [(0, p) for p in every_point({"x": ShapeRange((lo, 1, HEADS * DIM), (lo, 1, HEADS * DIM),
                                                         (hi, 2, HEADS * DIM))})]


def test_the_warm_up_records_every_shape(engine):
    points = _points(1, 4)  # batch 1..4 x seq 1..2
    assert len(points) == 8
    assert engine._warm(points)
    program = engine.shape_program
    for _, point in points:
        assert program.lookup(input_signature({"x": torch.zeros(point["x"])})) is not None, point


def test_a_refused_shape_stops_the_warm_up_with_a_note(engine):
    bad = [(0, {"x": (2, 3, HEADS * DIM + 1)})]  # a feature size the weights do not take
    notes_before = len(engine.build_info.get("load_notes", []))
    assert engine._warm(_points(1, 2) + bad) is False
    notes = engine.build_info["load_notes"][notes_before:]
    assert len(notes) == 1 and "warm-up at x 2x3x17 failed" in notes[0]
