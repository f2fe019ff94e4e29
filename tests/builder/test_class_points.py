"""Warm-up shapes per size class: a dynamic engine's first call at a new shape compiles no Triton kernel."""

from __future__ import annotations

import itertools

from kiln.builder.specialize import MAX_CLASS_POINTS, SPECIALIZE_BY, class_points
from kiln.config import ShapeRange


def _class(v: int) -> str:
    return "one" if v == 1 else "multiple" if v % SPECIALIZE_BY == 0 else "other"


def test_text_profiles_meet_every_class_combination_and_inputs_agree():
    r = ShapeRange((1, 16), (8, 128), (32, 512))
    points = class_points({"input_ids": r, "attention_mask": r, "token_type_ids": r})
    assert all(len({p[n] for n in p}) == 1 for p in points)  # the three inputs always agree
    shapes = [p["input_ids"] for p in points]
    assert all(r.contains(s) for s in shapes)
    seen = {(_class(b), _class(s)) for b, s in shapes}
    assert seen == set(itertools.product(["one", "multiple", "other"], ["multiple", "other"]))  # seq is never 1
    assert any(_class(b * s) == "multiple" and _class(s) == "other" for b, s in shapes)  # e.g. 16 x 17 tokens


def test_image_profiles_vary_the_batch_only_and_static_profiles_get_none():
    points = class_points({"image": ShapeRange((1, 3, 224, 224), (32, 3, 224, 224), (64, 3, 224, 224))})
    assert sorted(p["image"][0] for p in points) == [1, 2, 16]
    assert {p["image"][1:] for p in points} == {(3, 224, 224)}
    assert class_points({"x": ShapeRange((4, 8), (4, 8), (4, 8))}) == []


def test_narrow_ranges_give_only_the_classes_they_hold_and_many_dims_are_capped():
    points = class_points({"x": ShapeRange((17, 3), (18, 3), (20, 5))})
    assert [p["x"] for p in points] == [(17, 3)]  # 17..20 and 3..5 hold neither 1 nor a multiple of 16
    wide = {f"x{i}": ShapeRange((1,), (8,), (64 + i,)) for i in range(5)}  # five distinct ranges: 3^5 combinations
    assert len(class_points(wide)) == MAX_CLASS_POINTS
