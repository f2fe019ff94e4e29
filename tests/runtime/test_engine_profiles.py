"""Several optimization profiles per engine: profile selection, per-profile tactics and kernels, plans keeping them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.config import ShapeRange
from kiln.errors import InputError, PlanError
from kiln.runtime.io import select_profile
from kiln.tactics import registry
from kiln.tactics.choice import Choice
from test_fuzz import _join, _split

W = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
SMALL = {"x": ((1, 4), (2, 4), (4, 4))}
LARGE = {"x": ((4, 4), (8, 4), (16, 4))}


def dynamic_model() -> bytes:
    """x[b, 4] @ W → Relu → Softmax: three layers, a dynamic batch."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])],
                              [numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _build(*profiles) -> kiln.Engine:
    return kiln.build(dynamic_model(), kiln.BuildConfig(device="cpu", profiles=profiles))


def test_select_profile_takes_the_nearest_opt_and_names_every_range_when_none_fits():
    profiles = kiln.BuildConfig(profiles=(SMALL, LARGE)).profiles
    assert [select_profile({"x": (b, 4)}, profiles) for b in (1, 3, 4, 5, 16)] == [0, 0, 0, 1, 1]
    assert select_profile({"x": (4, 4)}, tuple(reversed(profiles))) == 1  # opt 2 is nearer to 4 than opt 8
    assert select_profile({"x": (7, 4)}, ()) == 0
    with pytest.raises(InputError, match="outside every optimization profile") as e:
        select_profile({"x": (17, 4)}, profiles)
    assert "profile 0: x 1x4..4x4 (opt 2x4)" in str(e.value) and "profile 1: x 4x4..16x4 (opt 8x4)" in str(e.value)
    assert "--profile" in str(e.value)


def test_two_profile_engine_runs_in_each_profile_as_a_one_profile_build():
    two, one = _build(SMALL, LARGE), _build({"x": ((1, 4), (8, 4), (16, 4))})
    assert two.profile_count == 2 and one.profile_count == 1
    assert [two.select_profile({"x": (b, 4)}) for b in (2, 12)] == [0, 1]
    for profile in ("auto", 0, 1):
        ctx = two.create_context(profile=profile)
        assert ctx.profile == profile
    for batch in (1, 3, 9, 16):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        np.testing.assert_array_equal(two.create_context().run({"x": x})["y"], one.run({"x": x})["y"])
    for bad in (2, -1, "first", True):
        with pytest.raises(InputError, match="profile"):
            two.create_context(profile=bad)
    with pytest.raises(InputError, match="profile 2 does not exist"):
        two.kernels_for(2)


def test_per_profile_kernels_share_identical_choices_and_plans_keep_them(tmp_path):
    built = _build(SMALL, LARGE)
    layer = built.network.layers[0].name
    other = dict(built.tactics) | {layer: Choice(registry.REFERENCE, {"tuned": "at 8x4"}, 1.5, "timed",
                                                 [("fast{}", "fails at profile 1 max shapes (x 16x4): wrong")])}
    engine = kiln.Engine(built.network, built.config, built.device, tactics=built.tactics,
                         profile_tactics=[built.tactics, other])
    k0, k1 = engine.kernels_for(0), engine.kernels_for(1)
    assert k0 == engine.kernels and k1[0] is not k0[0] and all(a is b for a, b in zip(k0[1:], k1[1:]))
    path = engine.save(tmp_path / "two.plan")
    loaded = kiln.load(path)
    assert loaded.profile_tactics[1][layer] == other[layer] and loaded.profile_tactics[0] == loaded.tactics
    assert loaded.config.profiles == engine.config.profiles
    header, manifest, weights = _split(path.read_bytes())
    assert list(manifest["profile_tactics"][0]) == [layer]  # only what differs from profile 0
    for bad, why in ([{"ghost": {"tactic": "reference"}}], "tactics for layers it does not have"), \
                    ([{}, {}], "one entry per profile"), ("x", "one entry per profile"), ([[1]], "not a mapping"):
        (tmp_path / "bad.plan").write_bytes(_join(header, dict(manifest, profile_tactics=bad), weights))
        with pytest.raises(PlanError, match=why):
            kiln.load(tmp_path / "bad.plan")


def test_build_config_json_round_trip_with_two_profiles():
    config = kiln.BuildConfig(profiles=(SMALL, LARGE), fp16=True)
    back = kiln.BuildConfig.from_json(config.to_json())
    assert back == config and back.profiles[1]["x"] == ShapeRange((4, 4), (8, 4), (16, 4))
