"""NVTX ranges per layer (`create_context(nvtx=True)`, `--nvtx`): one balanced range per layer named after it, no
wrapper when off, eager runs (no CUDA graph) when on; the CLI flag on the CPU backend only says it has no effect."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kiln
import kiln.runtime.context as context
from kiln.bench.profile import profile_layers
from kiln.bench.result import BenchResult
from kiln.bench.session import BenchOptions, run_bench
from kiln.errors import ConfigError, KilnError
from kiln.runtime.nvtx import label
from test_cli import invoke, tiny_model

X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3


@pytest.fixture
def engine(tmp_path):
    return kiln.build(str(tiny_model(tmp_path / "tiny.onnx")), kiln.BuildConfig(device="cpu"))


@pytest.fixture
def ranges(monkeypatch):
    """torch.cuda.nvtx's range_push / range_pop recording their calls instead of talking to NVTX."""
    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    return calls


def per_layer(engine, passes: int = 1) -> list[tuple]:
    return [c for layer in engine.network.layers for c in (("push", label(layer)), ("pop",))] * passes


def test_one_balanced_range_per_layer_named_after_it(engine, ranges):
    expected = engine.create_context().run({"x": X})
    assert ranges == []  # off: no wrapper, no range
    out = engine.create_context(nvtx=True).run({"x": X})
    assert ranges == per_layer(engine)
    assert all(f"kiln:{l.name} ({l.kind})" == label(l) for l in engine.network.layers)
    for name, value in expected.items():
        np.testing.assert_array_equal(out[name], value)


def test_a_failing_layer_still_pops_its_range(engine, ranges, monkeypatch):
    def broken(args, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "kernels", list(engine.kernels))
    engine.kernels[1] = broken
    with pytest.raises(KilnError, match="boom"):
        engine.create_context(nvtx=True).run({"x": X})
    assert ranges == per_layer(engine)[:4]


def test_nvtx_without_a_cuda_build_of_torch_is_a_config_error(engine, monkeypatch):
    def missing(name):
        raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")

    monkeypatch.setattr(torch.cuda.nvtx, "range_push", missing)
    with pytest.raises(ConfigError, match="CUDA build of torch"):
        engine.create_context(nvtx=True).run({"x": X})


def test_nvtx_runs_eagerly_on_cuda(engine, monkeypatch):
    """On a CUDA engine, nvtx=True gives a context without a CUDA graph cache (ranges are recorded at launch)."""
    monkeypatch.setattr(context.torch.cuda, "Stream", lambda: "stream")
    monkeypatch.setattr(context, "GraphCache", lambda stream, max_graphs, casts: ("graphs", stream))
    monkeypatch.setattr(context, "Arena", lambda e: None)
    fake = SimpleNamespace(device=SimpleNamespace(backend="cuda"), config=SimpleNamespace(cuda_graph=True, profiles=()),
                           network=engine.network, kernels=engine.kernels, boundary_casts=engine.boundary_casts)
    assert context.ExecutionContext(fake).graphs == ("graphs", "stream")
    assert context.ExecutionContext(fake, nvtx=True).graphs is None


def test_profile_layers_ranges_each_pass(engine, ranges):
    profile_layers(engine, {"x": X}, iterations=3, warmup=1, nvtx=True)
    assert ranges == per_layer(engine, passes=4)


def test_bench_notes(engine, ranges):
    result = run_bench(engine, {"x": X}, BenchOptions(iterations=2, warmup=0, nvtx=True))
    assert ranges == []  # the CPU backend: no effect
    assert "--nvtx has no effect on the CPU backend (no CUDA)" in result.notes()
    cuda = BenchResult([], 1.0, 1, "cuda:0", 0, nvtx=True)
    assert any(n.startswith("--nvtx:") and "without CUDA graph replay" in n for n in cuda.notes())
    assert not any("nvtx" in n for n in BenchResult([], 1.0, 1, "cuda:0", 0).notes())


@pytest.mark.parametrize("command", [["run"], ["bench", "--iterations", "2", "--warmup", "0"],
                                     ["profile", "--iterations", "1", "--warmup", "0"]])
def test_cli_flag_notes_no_effect_on_cpu(command, tmp_path, ranges):
    plan = tmp_path / "tiny.plan"
    assert invoke("build", str(tiny_model(tmp_path / "tiny.onnx")), "-o", str(plan), "--device", "cpu",
                  "--shapes", "x:2x4").exit_code == 0
    result = invoke(command[0], str(plan), *command[1:], "--nvtx")
    assert result.exit_code == 0, result.output
    assert result.output.count("--nvtx has no effect on the CPU backend (no CUDA)") == 1
    assert ranges == []
    help_text = " ".join(invoke(command[0], "--help").output.split())
    assert "--nvtx" in help_text and "eagerly" in help_text
