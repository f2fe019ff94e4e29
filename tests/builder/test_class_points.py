"""Warm-up shapes per size class (a dynamic engine's first call at a new shape compiles no Triton kernel) and every
shape of a small profile (where cuDNN plans per shape)."""

from __future__ import annotations

import itertools

from kiln.builder.specialize import MAX_CLASS_POINTS, MAX_EVERY_POINTS, SPECIALIZE_BY, class_points, every_point
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
    # products of dims (strides, counts) meet both classes too, whatever the dims' own: 16x100's s*s is a
    # multiple of 16 (as 20*20), 16x17's is not
    for b, s in [(16, 100), (5, 77), (3, 300), (7, 333), (24, 200)]:
        want = {_class(x) for x in (b, s, b * s, s * s, b * s * s)}
        assert any(tuple(_class(x) for x in (pb, ps, pb * ps, ps * ps, pb * ps * ps)) ==
                   tuple(_class(x) for x in (b, s, b * s, s * s, b * s * s)) for pb, ps in shapes), (b, s, want)


def test_image_profiles_vary_the_batch_only_and_static_profiles_get_none():
    points = class_points({"image": ShapeRange((1, 3, 224, 224), (32, 3, 224, 224), (64, 3, 224, 224))})
    assert sorted(p["image"][0] for p in points) == [1, 2, 3, 4, 8, 16]  # 1, then 0..3 and 4+ factors of two
    assert {p["image"][1:] for p in points} == {(3, 224, 224)}
    assert class_points({"x": ShapeRange((4, 8), (4, 8), (4, 8))}) == []


def test_narrow_ranges_give_only_the_classes_they_hold_and_many_dims_are_capped():
    points = class_points({"x": ShapeRange((17, 3), (18, 3), (20, 5))})
    assert sorted(p["x"] for p in points) == [(17, 3), (17, 4), (18, 3), (18, 4), (20, 3), (20, 4)]  # no 8 or 16
    wide = {f"x{i}": ShapeRange((1,), (8,), (64 + i,)) for i in range(5)}  # five distinct ranges: 6^5 combinations
    assert len(class_points(wide)) == MAX_CLASS_POINTS


def test_every_point_covers_a_small_profile_once_and_refuses_a_large_one():
    image = {"image": ShapeRange((1, 3, 224, 224), (32, 3, 224, 224), (64, 3, 224, 224))}
    points = every_point(image)
    assert [p["image"] for p in points] == [(b, 3, 224, 224) for b in range(1, 65)]
    pair = ShapeRange((2, 4), (3, 5), (3, 6))  # two inputs of one range: they move together, 2 x 3 shapes
    points = every_point({"a": pair, "b": pair})
    assert sorted(p["a"] for p in points) == [(b, s) for b in (2, 3) for s in (4, 5, 6)]
    assert all(p["a"] == p["b"] for p in points)
    text = ShapeRange((1, 16), (8, 128), (32, 512))  # 32 x 497 shapes: far more than a warm-up should run
    assert 32 * 497 > MAX_EVERY_POINTS and every_point({"input_ids": text}) == []
    assert every_point({"x": ShapeRange((4, 8), (4, 8), (4, 8))}) == []  # static: nothing to add
