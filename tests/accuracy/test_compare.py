"""`kiln compare`: kiln against ONNX Runtime per output and per intermediate tensor, on tiny MatMul/Relu/Mul
models; a deliberately broken kernel must FAIL and be named by --mark-all; error paths give one line."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import kiln
from kiln.accuracy.metrics import Tolerance, compare_arrays, parse_tolerance
from kiln.cli.app import app
from kiln.errors import ConfigError


def chain_model(path, up: float = 2.0 ** 17):
    """y = (relu(x @ w1) * up * (1/up)) @ w2 + b2: kiln fuses it into mm1 (FusedGemm), scale_up (PointwiseChain)
    and mm2 (FusedGemm). With up = 2**17 the middle layer overflows in fp16 (and only it: in fp32 it is exact)."""
    rng = np.random.default_rng(1)
    f32 = lambda name, a: numpy_helper.from_array(np.asarray(a, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "up"], ["big"], name="scale_up"),
             helper.make_node("Mul", ["big", "down"], ["back"], name="scale_down"),
             helper.make_node("MatMul", ["back", "w2"], ["z"], name="mm2"),
             helper.make_node("Add", ["z", "b2"], ["y"], name="bias")]
    io = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8])  # noqa: E731
    graph = helper.make_graph(nodes, "chain", [io("x")], [io("y")], initializer=[
        f32("w1", rng.standard_normal((8, 8))), f32("w2", rng.standard_normal((8, 8)) * 0.3),
        f32("up", up), f32("down", 1 / up), f32("b2", rng.standard_normal(8))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


@pytest.fixture
def model(tmp_path):
    return chain_model(tmp_path / "chain.onnx")


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_error_line(result, *words):
    assert result.exit_code not in (0, 70), result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for w in words:
        assert w in lines[0], lines[0]


def broken(monkeypatch, layer: str):
    """Make every engine kiln.build returns add 1.0 to `layer`'s output."""
    real = kiln.build

    def build(*args, **kwargs):
        engine = real(*args, **kwargs)
        step = [l.name for l in engine.network.layers].index(layer)
        kernel = engine.kernels[step]
        engine.kernels[step] = lambda values: [v + 1.0 for v in kernel(values)]
        return engine

    monkeypatch.setattr(kiln, "build", build)


def test_fp32_engine_passes(model):
    result = invoke("compare", model, "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    y = json.loads(result.stdout)["outputs"]["y"]
    assert y["passed"] and y["max_abs"] < 1e-5 and y["cosine"] > 0.999999 and y["nan_got"] == y["inf_got"] == 0
    table = invoke("compare", model, "--device", "cpu")
    assert table.exit_code == 0 and "PASS" in table.stdout and "PASSED: 1 of 1" in table.stdout


def test_broken_layer_fails_and_mark_all_names_it(model, monkeypatch):
    broken(monkeypatch, "scale_up")
    result = invoke("compare", model, "--device", "cpu", "--mark-all", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert not report["passed"] and report["first_bad"] == {"layer": "scale_up", "tensor": "back"}
    assert report["intermediates"]["r"]["passed"]  # the layer before it is still right
    assert report["intermediates"]["back"]["max_abs"] == pytest.approx(1.0, abs=1e-5)
    table = invoke("compare", model, "--device", "cpu", "--mark-all")
    assert table.exit_code == 1 and "first layer beyond tolerance: scale_up (PointwiseChain)" in table.stdout


def test_per_output_tolerance_decides(model, monkeypatch):
    broken(monkeypatch, "mm2")  # y is off by exactly 1.0
    assert invoke("compare", model, "--device", "cpu").exit_code == 1
    assert invoke("compare", model, "--device", "cpu", "--tol", "y=0,1.01").exit_code == 0
    assert invoke("compare", model, "--device", "cpu", "--atol", "1.01").exit_code == 0


def test_inputs_from_files_and_a_plan(model, tmp_path):
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert invoke("compare", model, "--device", "cpu", "--input", f"x={tmp_path / 'x.npy'}").exit_code == 0
    assert invoke("compare", model, "--device", "cpu", "--inputs-dir", tmp_path).exit_code == 0
    plan = tmp_path / "chain.plan"
    assert invoke("build", model, "-o", plan, "--device", "cpu").exit_code == 0
    assert invoke("compare", model, "--plan", plan).exit_code == 0
    assert_one_error_line(invoke("compare", model, "--plan", plan, "--fp16"), "--plan")


@pytest.mark.parametrize("spec", ["y", "y=1e-3", "y=a,b", "=1,2", "y=1,2,3", "y=-1,0"])
def test_bad_tol_is_one_line(model, spec):
    assert_one_error_line(invoke("compare", model, "--device", "cpu", "--tol", spec), "--tol")


def test_error_paths(model, tmp_path, monkeypatch):
    assert_one_error_line(invoke("compare", tmp_path / "missing.onnx"), "missing.onnx", "does not exist")
    assert_one_error_line(invoke("compare", model, "--device", "cpu", "--tol", "nope=1,1"), "nope")
    assert_one_error_line(invoke("compare", model, "--device", "cpu", "--inputs-dir", tmp_path), "x.npy")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    assert_one_error_line(invoke("compare", model, "--device", "cpu"), "pip install onnxruntime")


def test_metrics_of_known_arrays():
    ref = np.array([1.0, 2.0, 0.0, np.inf, np.nan])
    m = compare_arrays(ref, np.array([1.1, 2.0, 0.0, np.inf, np.nan]), Tolerance(0.0, 0.2))
    assert m.passed and m.max_abs == pytest.approx(0.1) and m.max_rel == pytest.approx(0.1)
    assert m.ratio == pytest.approx(0.5) and (m.nan_ref, m.inf_ref, m.nan_got, m.inf_got) == (1, 1, 1, 1)
    bad = compare_arrays(ref, np.array([1.0, 2.0, np.nan, np.inf, np.nan]), Tolerance(1.0, 1.0))
    assert not bad.passed and bad.ratio == math.inf and bad.note  # a NaN where the reference has a number
    assert not compare_arrays(np.ones(3), np.ones(4), Tolerance(1, 1)).passed
    assert compare_arrays(np.array([1.0, 0.0]), np.array([1.0, 0.01]), Tolerance(0, 0, cosine=0.999)).passed
    assert not compare_arrays(np.array([1.0, 0.0]), np.array([0.0, 1.0]), Tolerance(0, 0, cosine=0.999)).passed
    assert parse_tolerance("out:0=1e-3,1e-4") == ("out:0", Tolerance(1e-3, 1e-4))
    with pytest.raises(ConfigError):
        parse_tolerance("out=1e-3")


def test_a_layer_with_wrong_weights_in_the_plan_is_named(model, tmp_path):
    """Tamper with one layer's weights inside a saved plan (re-sealed with a valid checksum, as a buggy builder
    would write it): compare must FAIL and --mark-all must name that layer, not a later one."""
    from kiln.engine import plan as planfile

    path = tmp_path / "chain.plan"
    assert invoke("build", model, "-o", path, "--device", "cpu").exit_code == 0
    p = planfile.read(path)
    layer = next(l for l in p.manifest["network"]["layers"] if l["name"] == "mm1")
    weight = max((f"const/{i}" for i in layer["inputs"] if f"const/{i}" in p.tensors),
                 key=lambda k: p.tensors[k].numel())
    p.tensors[weight] = p.tensors[weight] + 0.5
    header = {k: v for k, v in p.header.items() if k not in ("payload_bytes", "payload_sha256")}
    planfile.write(path, planfile.encode(header, p.manifest, p.tensors))
    result = invoke("compare", model, "--plan", path, "--mark-all", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert not report["passed"] and report["first_bad"]["layer"] == "mm1"
    assert report["intermediates"][report["first_bad"]["tensor"]]["max_abs"] > 0.1
