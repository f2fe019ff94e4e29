"""refine_shapes: a dynamic network's unknown dims resolved from runs across its profiles' range."""

from __future__ import annotations

import kiln
from kiln.builder.specialize import probe_points, refine_shapes
from kiln.config import BuildConfig
from kiln.frontend.onnx import import_onnx, load_onnx
from test_shape_program import HEADS, PROFILE, model  # noqa: F401  (the fixture)


def test_probe_points_cover_min_opt_max_and_an_interior_shape():
    (profile,) = BuildConfig(profiles=({"x": PROFILE},)).profiles
    points = probe_points((profile,))
    assert [p["x"] for p in points] == [PROFILE[0], PROFILE[1], PROFILE[2], (3, 12, PROFILE[0][2])]


def test_unknown_dims_take_the_inputs_symbols_or_their_constant_value(model):  # noqa: F811
    net = import_onnx(load_onnx(str(model)).proto)
    config = BuildConfig(profiles=({"x": PROFILE},))
    unknown = [t for t in net.tensors.values() if t.shape and any(str(d).startswith("unk") for d in t.shape)]
    assert unknown  # shape inference cannot see through the computed reshapes
    assert refine_shapes(net, config.profiles, "cpu") >= len(unknown)
    for t in net.tensors.values():
        assert t.shape is None or all(isinstance(d, int) or d in ("b", "s") for d in t.shape), t
    heads = [t for t in net.tensors.values() if t.shape and len(t.shape) == 4 and HEADS in t.shape[1:2]]
    assert heads  # the per-head views know their head count


def test_a_dynamic_build_refines_and_says_so(model):  # noqa: F811
    engine = kiln.build(str(model), BuildConfig(profiles=({"x": PROFILE},)))
    assert any("refined" in n for n in engine.build_info.get("notes", [])), engine.build_info.get("notes")
