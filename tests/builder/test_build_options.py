"""Build options of issue 4: --memory-pool workspace=, --no-cuda-graph, --keep-io-precision / --reduced-io-precision."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import kiln
from kiln.builder.autotune import workspace_bytes
from kiln.cli.options import parse_memory_pools
from kiln.errors import ConfigError
from test_cli import invoke, tiny_model


@pytest.mark.parametrize("spec, want", [("workspace=256M", 256 * 2**20), ("workspace:1G", 2**30),
                                         ("workspace=512", 512), ("workspace=1.5KiB", 1536), ("workspace=0", 0)])
def test_memory_pool_sizes(spec, want):
    assert parse_memory_pools([spec]) == {"workspace": want}


@pytest.mark.parametrize("spec", ["workspace", "workspace=lots", "arena=1M", "workspace=-1", "=1M"])
def test_memory_pool_errors_name_the_form(spec):
    with pytest.raises(ConfigError, match="workspace=SIZE"):
        parse_memory_pools([spec])


def test_negative_workspace_refused_by_config():
    with pytest.raises(ConfigError, match="workspace"):
        kiln.BuildConfig(workspace_bytes=-5)


def test_cli_records_options_in_the_plan_and_says_what_the_cpu_ignores(tmp_path):
    model, out = tiny_model(tmp_path / "m.onnx"), tmp_path / "m.plan"
    r = invoke("build", str(model), "-o", str(out), "--device", "cpu", "--shapes", "x:2x4", "--no-cuda-graph",
               "--memory-pool", "workspace=64M", "--reduced-io-precision", "--fp16", "--json")
    assert r.exit_code == 0, r.output
    notes = " ".join(json.loads(r.stdout)["notes"])
    assert "--memory-pool workspace= has no effect on the CPU backend" in notes
    assert "--no-cuda-graph has no effect on the CPU backend" in notes
    engine = kiln.load(out)
    assert engine.config.cuda_graph is False
    assert engine.config.workspace_bytes == 64 * 2**20
    assert engine.config.keep_io_precision is False
    # reduced I/O precision: the fp16 engine's outputs are fp16 instead of the declared fp32
    y = engine.create_context().run({"x": np.ones((2, 4), np.float32).astype(np.float16)})["y"]
    assert y.dtype == np.float16


def test_keep_io_precision_is_the_default(tmp_path):
    model, out = tiny_model(tmp_path / "m.onnx"), tmp_path / "m.plan"
    assert invoke("build", str(model), "-o", str(out), "--device", "cpu", "--shapes", "x:2x4", "--fp16").exit_code == 0
    engine = kiln.load(out)
    y = engine.create_context().run({"x": np.ones((2, 4), np.float32)})["y"]
    assert engine.config.keep_io_precision and y.dtype == np.float32


def _conv_model(path):
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 32, 3, 3)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32, 56, 56])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64, 56, 56])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.gpu
def test_workspace_measures_transient_memory_only():
    x = torch.randn(1024, 1024, device="cuda")
    assert workspace_bytes(lambda a: [a[0] + 1], [x]) == 0                      # the output is not workspace
    assert workspace_bytes(lambda a: [(a[0] * 2 + 1).sum()], [x]) >= x.numel() * 4  # the temporary is


@pytest.mark.gpu
def test_zero_workspace_skips_tactics_that_need_one_and_says_why(tmp_path):
    model = _conv_model(tmp_path / "conv.onnx")
    engine = kiln.build(model, kiln.BuildConfig(device="cuda", workspace_bytes=0, opt_level=2))
    x = np.random.default_rng(1).standard_normal((8, 32, 56, 56)).astype(np.float32)
    want = kiln.build(model, kiln.BuildConfig(device="cpu")).create_context().run({"x": x})["y"]
    got = engine.create_context().run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    for choice in engine.tactics.values():
        for label, why in choice.rejected:
            if "workspace" in why:
                assert "over the limit of 0" in why, why
