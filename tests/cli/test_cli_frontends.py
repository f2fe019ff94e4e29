"""`python -m kiln`, a light `kiln --help`, --input for bench / profile, build flags on `bench m.onnx`, and
`kiln compare --cosine / --against / --save-outputs / --load-outputs` (issue 28 part 3)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from test_cli import assert_one_error_line, invoke, model, plan, reference, tiny_model  # noqa: F401 (fixtures)


def test_python_m_kiln_help_does_not_import_torch():
    done = subprocess.run([sys.executable, "-m", "kiln", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "bench" in done.stdout and "compare" in done.stdout, done.stderr
    probe = "import sys, kiln.cli.app; print(sorted(m for m in ('torch', 'onnx', 'triton', 'kiln.runtime') " \
            "if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_bench_and_profile_take_inputs(plan, model, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    result = invoke("bench", str(model), "--device", "cpu", "--input", f"x={tmp_path / 'x.npy'}", "--iterations", "2",
                    "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["shapes"] == {"x": [3, 4]} and not result.stderr.strip()
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32))
    result = invoke("profile", str(plan), "--input", str(tmp_path / "in.npz"), "--iterations", "2", "--json")
    assert result.exit_code == 0, result.output
    assert_one_error_line(invoke("bench", str(plan), "--input", f"nope={tmp_path / 'x.npy'}"), "nope")
    assert_one_error_line(invoke("bench", str(plan), "--input", f"x={tmp_path / 'x.npy'}"))  # 3x4 for a 2x4 plan
    assert_one_error_line(invoke("bench", str(model), "--device", "cpu", "--input", f"x={tmp_path / 'x.npy'}",
                                 "--shapes", "x:2x4"), "--shapes", "--input")


def test_profile_dynamic_input_without_shapes_warns_once(model):
    result = invoke("profile", str(model), "--device", "cpu", "--iterations", "1", "--json")
    assert result.exit_code == 0, result.output
    warning, = result.stderr.strip().splitlines()
    assert warning.startswith("warning: ") and "--shapes x:1x4" in warning


def test_bench_onnx_takes_the_build_flags(model, tmp_path):
    cache = tmp_path / "timing.cache"
    result = invoke("bench", str(model), "--device", "cpu", "--shapes", "x:2x4", "--fp16", "--opt-level", "1",
                    "--timing-cache", str(cache), "--layer-precision", "add=fp32", "--iterations", "2", "--json")
    assert result.exit_code == 0, result.output
    result = invoke("bench", str(model), "--device", "cpu", "--min-shapes", "x:1x4", "--max-shapes", "x:8x4",
                    "--iterations", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["shapes"] == {"x": [8, 4]}  # the profile's opt shape, with a warning
    assert "opt shape" in result.stderr
    assert_one_error_line(invoke("bench", str(model), "--device", "cpu", "--shapes", "x:2x4", "--calibrator", "minmax"),
                          "--calibrator")


def test_bench_plan_refuses_build_flags(plan):
    assert_one_error_line(invoke("bench", str(plan), "--fp16", "--opt-level", "1"), "--fp16", "--opt-level", "plan")


def test_compare_cosine_tolerance(model):
    result = invoke("compare", str(model), "--device", "cpu", "--shapes", "x:2x4", "--cosine", "0.999", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["passed"] and all(o["tolerance"] == "cosine>=0.999" and o["cosine"] > 0.999 for o in d["outputs"].values())
    text = invoke("compare", str(model), "--device", "cpu", "--shapes", "x:2x4", "--cosine", "0.999")
    assert text.exit_code == 0 and "PASSED: 2 of 2 outputs" in text.stdout
    assert_one_error_line(invoke("compare", str(model), "--device", "cpu", "--cosine", "1.5"), "--cosine")
    assert_one_error_line(invoke("compare", str(model), "--device", "cpu", "--cosine", "0.9", "--rtol", "1"),
                          "--cosine")


def test_compare_two_plans(model, plan, tmp_path):
    other = tmp_path / "fp16.plan"
    assert invoke("build", str(model), "-o", str(other), "--device", "cpu", "--shapes", "x:2x4", "--fp16"
                  ).exit_code == 0
    result = invoke("compare", "--plan", str(plan), "--against", str(other), "--cosine", "0.99", "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["outputs"]) == {"y", "../escape"}
    assert_one_error_line(invoke("compare", "--against", str(other)), "--plan")
    assert_one_error_line(invoke("compare", "--plan", str(plan), "--against", str(other), "--load-outputs",
                                 str(tmp_path / "r.npz")), "not both")


def test_compare_save_and_load_outputs(model, plan, tmp_path):
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ref = tmp_path / "ref.npz"
    args = ("--input", f"x={tmp_path / 'x.npy'}")
    result = invoke("compare", str(model), "--plan", str(plan), *args, "--save-outputs", str(ref))
    assert result.exit_code == 0, result.output
    saved = np.load(ref)
    np.testing.assert_allclose(saved["y"], reference(x)["y"], rtol=1e-6)
    result = invoke("compare", "--plan", str(plan), *args, "--load-outputs", str(ref), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"]
    np.savez(ref, y=saved["y"] + 1, **{"../escape": saved["../escape"]})  # y now differs
    result = invoke("compare", "--plan", str(plan), *args, "--load-outputs", str(ref), "--json")
    assert result.exit_code == 1 and not json.loads(result.stdout)["outputs"]["y"]["passed"]
    victim = tmp_path / "notes.txt"
    victim.write_text("mine")
    assert_one_error_line(invoke("compare", "--plan", str(plan), *args, "--load-outputs", str(ref),
                                 "--save-outputs", str(victim)), "--save-outputs")
    assert victim.read_text() == "mine"
    assert_one_error_line(invoke("compare", "--plan", str(plan), "--load-outputs", str(tmp_path / "none.npz")),
                          "does not exist")
