"""`--plugin`: custom ops imported from a file before the command; the plan records them as data and never imports
the plugin itself on load."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, save
from typer.testing import CliRunner

import kiln
import kiln.plugins
from kiln.cli.app import app
from kiln.engine import plan as plan_file
from kiln.errors import ConfigError, PlanError
from kiln.frontend.onnx.registry import IMPORTERS
from kiln.kinds.registry import KINDS

DOMAIN = "com.kiln.test_plugin"
PLUGIN = f'''
import pathlib, torch
from kiln.plugins import register_op

pathlib.Path(__file__).with_suffix(".imported").write_text("imported")  # the sentinel: this file ran
register_op("ScaleShift", lambda ins, a: ins[0] * a["scale"] + 1.0, domain="{DOMAIN}")
'''


@pytest.fixture(autouse=True)
def _unregister():
    """Each test starts and ends without the plugin op registered (the CLI runs in this process)."""
    kinds, importers, modules = dict(KINDS), {k: list(v) for k, v in IMPORTERS.items()}, set(sys.modules)
    yield
    KINDS.clear()
    KINDS.update(kinds)
    IMPORTERS.clear()
    IMPORTERS.update(importers)
    for name in set(sys.modules) - modules:
        if name.startswith("kiln_plugin_"):
            del sys.modules[name]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _model(path):
    node = helper.make_node("ScaleShift", ["x"], ["y"], name="ss0", domain=DOMAIN, scale=3.0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                           ir_version=10), path)
    return path


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "my_ops.py"
    path.write_text(PLUGIN)
    return path


@pytest.fixture
def built(tmp_path, plugin):
    """The plan built with --plugin, then the plugin unregistered and its sentinel removed."""
    out = tmp_path / "m.plan"
    r = invoke("build", _model(tmp_path / "m.onnx"), "-o", out, "--device", "cpu", "--plugin", plugin)
    assert r.exit_code == 0, r.output
    assert plugin.with_suffix(".imported").exists()
    plugin.with_suffix(".imported").unlink()
    KINDS.pop(f"{DOMAIN}::ScaleShift")
    IMPORTERS.pop((DOMAIN, "ScaleShift"))
    for name in [m for m in sys.modules if m.startswith("kiln_plugin_my_ops")]:
        del sys.modules[name]
    return out


def test_build_records_the_plugin_and_run_with_it_is_correct(tmp_path, plugin, built):
    import hashlib

    _, payload = plan_file.unpack(built.read_bytes())
    manifest = json.loads(payload[8:8 + int.from_bytes(payload[:8], "little")])
    assert manifest["plugins"] == [{"kind": f"{DOMAIN}::ScaleShift", "module": "my_ops", "file": "my_ops.py",
                                    "sha256": hashlib.sha256(plugin.read_bytes()).hexdigest()}]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    r = invoke("run", built, "--plugin", plugin, "-i", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), x * 3.0 + 1.0)
    assert "warning" not in r.output


def test_run_without_plugin_names_op_and_module_and_imports_nothing(plugin, built):
    r = invoke("run", built)
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "ScaleShift" in lines[0] and DOMAIN in lines[0] and "my_ops" in lines[0]
    assert "--plugin my_ops.py" in lines[0]
    assert not plugin.with_suffix(".imported").exists()  # the plan names the module; kiln never imports it
    assert not any(m.startswith("kiln_plugin_") or m == "my_ops" for m in sys.modules)
    with pytest.raises(PlanError, match="import that module before kiln.load"):
        kiln.load(built)
    assert not plugin.with_suffix(".imported").exists()


def test_inspect_needs_the_plugin_too(plugin, built):
    r = invoke("inspect", built)
    assert r.exit_code == 1 and "--plugin my_ops.py" in r.output
    r = invoke("inspect", built, "--plugin", plugin, "--json")
    assert r.exit_code == 0, r.output
    assert any(row["kind"] == f"{DOMAIN}::ScaleShift" for row in json.loads(r.output)["layers"])


def test_changed_plugin_source_warns_and_runs(plugin, built):
    plugin.write_text(PLUGIN + "# edited\n")
    r = invoke("run", built, "--plugin", plugin)
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "my_ops.py" in warnings[0] and "sha256" in warnings[0]


@pytest.mark.parametrize("content, expected", [
    (None, "no such file"),
    ("raise RuntimeError('boom in plugin')", "RuntimeError: boom in plugin"),
    ("def f(:\n", "SyntaxError"),
    ("x = 1\n", "registers no ops"),
])
def test_bad_plugin_is_one_error_line(tmp_path, content, expected):
    path = tmp_path / "bad_ops.py"
    if content is not None:
        path.write_text(content)
    r = invoke("build", _model(tmp_path / "m.onnx"), "--device", "cpu", "--plugin", path)
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: plugin ") and expected in lines[0], r.output


def test_unknown_module_and_reload(plugin):
    with pytest.raises(ConfigError, match="no such file or importable module"):
        kiln.plugins.load_plugin("kiln_no_such_plugin_module")
    assert kiln.plugins.load_plugin(plugin) == [f"{DOMAIN}::ScaleShift"]
    plugin.with_suffix(".imported").unlink()
    assert kiln.plugins.load_plugin(plugin) == [f"{DOMAIN}::ScaleShift"]  # unchanged: not imported again
    assert not plugin.with_suffix(".imported").exists()
    plugin.write_text(PLUGIN + "# edited\n")
    assert kiln.plugins.load_plugin(plugin) == [f"{DOMAIN}::ScaleShift"]  # changed: imported again, replacing it
    assert plugin.with_suffix(".imported").exists()
