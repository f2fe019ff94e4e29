"""`kiln build --profile MIN OPT MAX` (repeatable, as trtexec's profiles), and `kiln inspect` showing each profile."""

from __future__ import annotations

import json

import pytest

from kiln.cli.build import build_config, profile_from
from kiln.config import ShapeRange
from kiln.errors import ConfigError
from test_cli import assert_one_error_line, invoke
from test_engine_profiles import dynamic_model


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(dynamic_model())
    return str(path)


def test_several_profiles_with_min_max_shapes_and_fixed_inputs():
    profiles = profile_from({"k": (2,)}, {"x": (1, 4)}, {}, {"x": (2, 4)},
                            [("x:1x4", "x:2x4", "x:4x4"), ("x:4x4", "x:8x4", "x:16x4")])
    assert [p["x"] for p in profiles] == [ShapeRange((1, 4), (2, 4), (2, 4)), ShapeRange((1, 4), (2, 4), (4, 4)),
                                         ShapeRange((4, 4), (8, 4), (16, 4))]
    assert all(p["k"] == ShapeRange.fixed((2,)) for p in profiles)
    assert profile_from({"k": (2,)}, {}, {}, {}) == ({"k": ShapeRange.fixed((2,))},)
    config = build_config({}, "cpu", profile=[("x:1x4,y:1", "x:2x4,y:1", "x:4x4,y:2")])
    assert config.profiles == ({"x": ShapeRange((1, 4), (2, 4), (4, 4)), "y": ShapeRange((1,), (1,), (2,))},)


@pytest.mark.parametrize("profiles, why", [
    ([("x:1x4", "y:2x4", "x:4x4")], "MIN, OPT and MAX must name the same inputs"),
    ([("x:1x4", "x:8x4", "x:4x4")], "--profile x:1x4 x:8x4 x:4x4: profile shapes must satisfy"),
    ([("x:1x4", "x:2x4", "x:4x4x1")], "different ranks"),
    ([("x:1x4", "x:2", "x:4x4")], "different ranks"),
    ([("x=1x4", "x:2x4", "x:4x4")], "is not name:DIMS"),
    ([("x:1x4", "x:2x4", "x:4x4"), ("y:1x4", "y:2x4", "y:4x4")], "profile 1 ranges inputs \\['y'\\] but profile 0"),
    ([("x:1x4", "x:2x4")], "not three shape lists"),
    (["x:1x4 x:2x4 x:4x4"], "not three shape lists"),
])
def test_malformed_profiles_are_config_errors(profiles, why):
    with pytest.raises(ConfigError, match=why):
        profile_from({}, {}, {}, {}, profiles)


def test_fixed_input_also_in_a_profile_is_an_error():
    with pytest.raises(ConfigError, match="given both in --shapes and in --profile"):
        profile_from({"x": (1, 4)}, {}, {}, {}, [("x:1x4", "x:2x4", "x:4x4")])


def test_build_two_profiles_and_inspect_them(model, tmp_path):
    plan = str(tmp_path / "m.plan")
    result = invoke("build", model, "-o", plan, "--device", "cpu", "--profile", "x:1x4", "x:2x4", "x:4x4",
                    "--profile", "x:4x4", "x:8x4", "x:16x4")
    assert result.exit_code == 0, result.output
    d = json.loads(invoke("inspect", plan, "--json").stdout)
    assert [p["inputs"]["x"] for p in d["profiles"]] == [{"min": [1, 4], "opt": [2, 4], "max": [4, 4]},
                                                         {"min": [4, 4], "opt": [8, 4], "max": [16, 4]}]
    assert d["profiles"][1]["tactics_unlike_profile_0"] == {}  # the CPU backend runs the reference everywhere
    text = invoke("inspect", plan).stdout
    assert "Optimization profiles" in text and "16x4" in text and "8x4" in text
    assert "--profile x:1x4 x:2x4 x:4x4 --profile x:4x4 x:8x4 x:16x4" in d["header"]["rebuild"]
    result = invoke("bench", model, "--device", "cpu", "--iterations", "2", "--warmup", "0", "--shapes", "x:12x4",
                    "--profile", "x:1x4", "x:2x4", "x:4x4", "--profile", "x:4x4", "x:8x4", "x:16x4", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["shapes"] == {"x": [12, 4]}


def test_profile_errors_are_one_line(model, tmp_path):
    assert_one_error_line(invoke("build", model, "-o", str(tmp_path / "m.plan"), "--device", "cpu",
                                 "--profile", "x:1x4", "x:8x4", "x:4x4"), "min <= opt <= max")
    assert_one_error_line(invoke("bench", str(tmp_path / "none.plan"), "--profile", "x:1x4", "x:2x4", "x:4x4"),
                          "--profile")
