"""The `kiln` command line on tiny models (Add/Sub/Mul/Div/Relu), its error paths and its path safety."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

import kiln
import kiln.cli.conformance
from kiln.cli.app import app
from kiln.errors import InternalError
from kiln.builder.build import STAGES

W = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
W2 = np.array([2.0, 4.0, 0.5, 1.0], np.float32)


def reference(x: np.ndarray) -> dict[str, np.ndarray]:
    y = np.maximum(x + W, 0)
    return {"y": y, "../escape": (y - x) * W2 / W2 / 2}


def tiny_model(path, batch="batch"):
    """y = relu(x + w); '../escape' = (y - x) * w2 / w2 / 2 (an output named to try path traversal)."""
    two = onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu"),
             helper.make_node("Sub", ["y", "x"], ["d"], name="sub"),
             helper.make_node("Mul", ["d", "w2"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "w2"], ["q"], name="div"),
             helper.make_node("Div", ["q", "two"], ["../escape"], name="half")]
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, 4])  # noqa: E731
    graph = helper.make_graph(nodes, "tiny", [io("x")], [io("y"), io("../escape")],
                              initializer=[onnx.numpy_helper.from_array(W, "w"),
                                           onnx.numpy_helper.from_array(W2, "w2"), two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


@pytest.fixture
def model(tmp_path):
    return tiny_model(tmp_path / "tiny.onnx")


@pytest.fixture
def plan(model, tmp_path):
    out = tmp_path / "tiny.plan"
    result = invoke("build", str(model), "-o", str(out), "--device", "cpu", "--shapes", "x:2x4")
    assert result.exit_code == 0, result.output
    return out


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def assert_one_error_line(result, *words):
    """A user error: non-zero exit, exactly one `error: ...` line on stderr, no traceback."""
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for w in words:
        assert w in lines[0], lines[0]


# -- build ----------------------------------------------------------------------------------------------------
def test_build_writes_a_loadable_plan_and_a_summary(model, tmp_path):
    out = tmp_path / "m.plan"
    result = invoke("build", str(model), "-o", str(out), "--device", "cpu")
    assert result.exit_code == 0, result.output
    engine = kiln.load(out)
    assert "Build summary" in result.stdout and f"6 → {len(engine.network.layers)}" in result.stdout
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    got = engine.run({"x": x})
    for name, want in reference(x).items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)


def test_build_json_reports_nodes_passes_and_notes(model, tmp_path):
    result = invoke("build", str(model), "-o", str(tmp_path / "m.plan"), "--device", "cpu", "--fp16",
                    "--layer-precision", "add=fp32", "--json")
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["onnx_nodes"] == 6 and s["backend"] == "cpu"
    assert s["weight_bytes"] >= (W.nbytes + W2.nbytes) // 2  # fp16 halves the fp32 weights
    assert {"load", "import", "optimize", "plan"} <= set(s["stage_seconds"]) <= set(STAGES)
    assert isinstance(s["passes"], dict)
    assert any("fp16" in n for n in s["notes"])


def test_build_shape_ranges_become_a_profile(model, tmp_path):
    out = tmp_path / "m.plan"
    result = invoke("build", str(model), "-o", str(out), "--device", "cpu", "--min-shapes", "x:1x4",
                    "--max-shapes", "x:8x4", "--opt-level", "1")
    assert result.exit_code == 0, result.output
    config = kiln.load(out).config
    assert config.profiles == ({"x": kiln.ShapeRange((1, 4), (8, 4), (8, 4))},) and config.opt_level == 1


def test_build_default_output_is_next_to_the_model(model):
    assert invoke("build", str(model), "--device", "cpu").exit_code == 0
    assert model.with_suffix(".plan").is_file()


# -- run ------------------------------------------------------------------------------------------------------
def test_run_with_npy_input_writes_outputs_inside_the_folder(plan, tmp_path):
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    result = invoke("run", str(plan), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["_escape.npy", "y.npy"]
    assert not (tmp_path / "escape.npy").exists() and not (tmp_path / "../escape.npy").exists()
    want = reference(x)
    np.testing.assert_allclose(np.load(out / "y.npy"), want["y"], rtol=1e-6)
    np.testing.assert_allclose(np.load(out / "_escape.npy"), want["../escape"], rtol=1e-6, atol=1e-6)
    assert "Outputs" in result.stdout


def test_run_reads_npz_and_reports_json_stats(plan, tmp_path):
    x = np.full((2, 4), -5.0, np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    result = invoke("run", str(plan), "--input", str(tmp_path / "in.npz"), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    y = reference(x)["y"]
    assert rows["y"]["shape"] == [2, 4] and rows["y"]["dtype"] == "float32"
    assert rows["y"]["max"] == pytest.approx(float(y.max())) and rows["y"]["mean"] == pytest.approx(float(y.mean()))


def test_run_random_inputs_are_seeded(plan):
    first, again, other = (json.loads(invoke("run", str(plan), "--seed", s, "--json").stdout) for s in "112")
    assert first == again and first != other


def test_run_onnx_with_dynamic_batch_needs_shapes(model):
    assert_one_error_line(invoke("run", str(model), "--device", "cpu"), "--shapes x:1x4")
    result = invoke("run", str(model), "--device", "cpu", "--shapes", "x:3x4", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["y"]["shape"] == [3, 4]


def test_run_refuses_to_write_through_a_symlink(plan, tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim.npy"
    out.mkdir()
    victim.write_bytes(b"keep")
    (out / "y.npy").symlink_to(victim)
    assert_one_error_line(invoke("run", str(plan), "--output-dir", str(out)), "symbolic link")
    assert victim.read_bytes() == b"keep"


def test_run_never_unpickles_inputs(plan, tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert_one_error_line(invoke("run", str(plan), "--input", f"x={tmp_path / 'obj.npy'}"), "obj.npy")


# -- inspect --------------------------------------------------------------------------------------------------
def test_inspect_plan_lists_layers_memory_and_header(plan):
    result = invoke("inspect", str(plan), "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert sum(len(row["origin"]) for row in d["layers"]) == 6  # every ONNX node, fused or not, is accounted for
    first = d["layers"][0]
    assert "add" in first["origin"] and first["tactic"] == "reference" and first["weight_bytes"] >= W.nbytes
    assert first["inputs"][0] == {"name": "x", "dtype": "float32", "shape": "[2,4]"}
    assert d["memory"]["weight_bytes"] >= W.nbytes + W2.nbytes and isinstance(d["memory"]["arena_bytes"], int)
    assert d["header"]["device"]["backend"] == "cpu" and d["totals"]["onnx_nodes"] == 6
    text = invoke("inspect", str(plan))
    assert text.exit_code == 0 and "Layers" in text.stdout and "reference" in text.stdout


def test_inspect_header_does_not_read_the_payload(plan):
    data = bytearray(plan.read_bytes())
    data[-1] ^= 0xFF  # corrupt the weights: the header stays readable, the whole plan does not
    plan.write_bytes(bytes(data))
    result = invoke("inspect", str(plan), "--header", "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["header"]) >= {"kiln", "device", "payload_sha256", "source_sha256"}
    assert_one_error_line(invoke("inspect", str(plan)), "checksum")


def test_inspect_onnx_counts_ops_and_flags_unsupported(tmp_path):
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Mul", ["a", "a"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["c"]), helper.make_node("Frobnicate", ["c"], ["y"],
                                                                          domain="com.example")]
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])  # noqa: E731
    graph = helper.make_graph(nodes, "g", [io("x")], [io("y")],
                              initializer=[onnx.numpy_helper.from_array(np.zeros((3, 5), np.float32), "unused")])
    path = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]), path)
    result = invoke("inspect", str(path), "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    ops = {o["op"]: o for o in d["ops"]}
    assert ops["Add"]["count"] == 2 and ops["Add"]["supported"] and ops["Mul"]["count"] == 1
    assert not ops["Frobnicate"]["supported"] and d["unsupported"] == ["Frobnicate"]
    assert d["parameters"] == 15 and d["nodes"] == 4
    assert "Frobnicate" in invoke("inspect", str(path)).stdout


# -- bench ----------------------------------------------------------------------------------------------------
def test_bench_plan_reports_percentiles_and_throughput(plan):
    result = invoke("bench", str(plan), "--iterations", "7", "--warmup", "1", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    lat = d["latency_ms"]
    assert d["iterations"] == 7 and d["batch"] == 2
    assert 0 < lat["min"] <= lat["median"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert d["throughput"]["items_per_s"] == pytest.approx(2 * d["throughput"]["queries_per_s"])
    text = invoke("bench", str(plan), "--iterations", "3")
    assert text.exit_code == 0 and "latency p99" in text.stdout and "items/s" in text.stdout


def test_bench_builds_an_onnx_on_the_fly(model):
    result = invoke("bench", str(model), "--device", "cpu", "--shapes", "x:5x4", "--duration", "0.2", "--json")
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["batch"] == 5 and d["shapes"] == {"x": [5, 4]} and d["iterations"] >= 1


# -- conformance ----------------------------------------------------------------------------------------------
def test_conformance_writes_the_table(tmp_path):
    out = tmp_path / "docs" / "conformance.md"
    result = invoke("conformance", "--device", "cpu", "--include", "^test_relu_cpu$", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "passed" in result.stdout and "| Relu |" in out.read_text()


def test_conformance_says_when_no_test_matches(monkeypatch):
    monkeypatch.setattr(kiln.cli.conformance, "run_suite", lambda *args, **kwargs: [])
    assert_one_error_line(invoke("conformance", "--include", "^test_relu$"), "test_relu_cpu")


# -- errors ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["build", "missing.onnx"], ["missing.onnx", "does not exist"]),
    (["build", "{model}", "--shapes", "x=2x4"], ["--shapes", "name:DIMS"]),
    (["build", "{model}", "--shapes", "x:2x4", "--shapes", "x:3x4"], ["twice"]),
    (["build", "{model}", "--min-shapes", "x:1x4"], ["--max-shapes"]),
    (["build", "{model}", "--layer-precision", "add=fp64"], ["--layer-precision"]),
    (["build", "{model}", "--opt-level", "9"], ["opt_level"]),
    (["build", "{model}", "-o", "{model}"], ["overwrite"]),
    (["run", "{plan}", "--input", "nope={npy}"], ["unexpected ['nope']", "expects ['x']"]),
    (["run", "{plan}", "--input", "x={tmp}/missing.npy"], ["does not exist"]),
    (["run", "{plan}", "--input", "x.npy"], ["name=file.npy"]),
    (["run", "{plan}", "--shapes", "z:1"], ["['x']"]),
    (["run", "{npy}"], ["not a kiln plan"]),
    (["run", "{tmp}/missing.plan"], ["does not exist"]),
    (["inspect", "{npy}"], ["not a kiln plan"]),
    (["inspect", "{model}", "--header"], ["--header"]),
    (["bench", "{plan}", "--iterations", "0"], ["--iterations"]),
    (["conformance", "--include", "("], ["regular expression"]),
    (["conformance", "--category", "bogus"], ["--category"]),
])
def test_user_errors_are_one_line(args, words, model, plan, tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, np.ones((2, 4), np.float32))
    args = [a.format(model=model, plan=plan, npy=npy, tmp=tmp_path) for a in args]
    assert_one_error_line(invoke(*args), *words)


def test_wrong_input_dtype_is_one_line(plan, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.int32))
    assert_one_error_line(invoke("run", str(plan), "--input", f"x={tmp_path / 'x.npy'}"), "dtype")


def test_verbose_shows_the_traceback(tmp_path):
    result = invoke("run", str(tmp_path / "missing.plan"), "--verbose")
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and result.stderr.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize("exc", [InternalError("pass x broke"), RuntimeError("unexpected")])
def test_bugs_exit_70_with_one_line(model, monkeypatch, exc):
    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(kiln, "build", boom)
    result = invoke("build", str(model), "--device", "cpu")
    assert result.exit_code == 70
    assert_one_error_line(result, "bug in kiln", str(exc))


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.startswith(f"kiln {kiln.__version__}")
