"""`kiln build/bench/profile --shape-buckets N`: each dynamic profile split into batch buckets."""

from __future__ import annotations

import json

import pytest

from test_cli import assert_one_error_line, invoke
from test_engine_profiles import dynamic_model


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(dynamic_model())
    return str(path)


def test_build_with_shape_buckets_shows_three_profiles(model, tmp_path):
    plan = str(tmp_path / "m.plan")
    result = invoke("build", model, "-o", plan, "--device", "cpu", "--min-shapes", "x:1x4", "--opt-shapes", "x:8x4",
                    "--max-shapes", "x:64x4", "--shape-buckets", "3", "--json")
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert [p["x"] for p in s["profiles"]] == [{"min": [4, 4], "opt": [8, 4], "max": [15, 4]},
                                               {"min": [1, 4], "opt": [3, 4], "max": [3, 4]},
                                               {"min": [16, 4], "opt": [64, 4], "max": [64, 4]}]
    assert any("split along the batch" in n for n in s["notes"])
    d = json.loads(invoke("inspect", plan, "--json").stdout)
    assert len(d["profiles"]) == 3
    result = invoke("bench", model, "--device", "cpu", "--iterations", "2", "--warmup", "0", "--shapes", "x:10x4",
                    "--profile", "x:1x4", "x:8x4", "x:64x4", "--shape-buckets", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["shapes"] == {"x": [10, 4]}


@pytest.mark.parametrize("args, words", [
    (("--profile", "x:1x4", "x:8x4", "x:64x4", "--shape-buckets", "0"), ("--shape-buckets", "1..16")),
    (("--profile", "x:1x4", "x:8x4", "x:64x4", "--shape-buckets", "17"), ("--shape-buckets", "1..16")),
    (("--shapes", "x:8x4", "--shape-buckets", "3"), ("--shape-buckets", "--profile", "--min-shapes")),
    (("--shape-buckets", "3"), ("--shape-buckets", "--profile", "--min-shapes")),
])
def test_bad_shape_buckets_are_one_line_errors(model, tmp_path, args, words):
    assert_one_error_line(invoke("build", model, "-o", str(tmp_path / "m.plan"), "--device", "cpu", *args), *words)


def test_shape_buckets_with_a_plan_is_an_error(model, tmp_path):
    plan = str(tmp_path / "m.plan")
    assert invoke("build", model, "-o", plan, "--device", "cpu", "--shapes", "x:2x4").exit_code == 0
    assert_one_error_line(invoke("bench", plan, "--shape-buckets", "2"), "--shape-buckets", "plan")
    assert_one_error_line(invoke("profile", plan, "--shape-buckets", "2"), "--shape-buckets", "plan")
