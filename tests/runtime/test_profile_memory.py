"""The activation memory of a multi-profile engine (issue 23): a dynamic engine's activations are sized at run time
(its memory plan has no fixed arena: nothing is sized from profile 0), so a run at a later profile's larger max
shapes needs nothing beyond it; and the one memory plan places an output in the arena only where the layer's
kernel takes an output buffer under every profile."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import kiln
from kiln.cli.output import fmt_arena
from kiln.ir import DType, Layer, Network
from kiln.runtime import Engine
from kiln.runtime.arena import Arena
from kiln.tactics import registry
from kiln.tactics.choice import Choice
from kiln.target.device import Device
from test_engine_profiles import LARGE, SMALL, dynamic_model

CPU = Device("cpu", "cpu", "cpu")


def test_larger_later_profile_runs_at_its_max_with_run_time_sized_activations():
    engine = kiln.build(dynamic_model(), kiln.BuildConfig(device="cpu", profiles=(SMALL, LARGE)))
    assert engine.profile_count == 2 and LARGE["x"][2][0] > SMALL["x"][2][0]
    plan = engine.memory_plan
    assert plan.arena_bytes is None and plan.offsets == {}  # no arena sized from any one profile's shapes
    assert len(plan.release) == len(engine.network.layers)  # release points: shape-independent, every profile
    assert engine.serialize()  # the manifest's memory section says the same
    assert fmt_arena(plan.to_json()).startswith("sized at run time")
    session = ort.InferenceSession(dynamic_model(), providers=["CPUExecutionProvider"])
    for profile in ("auto", 1):
        ctx = engine.create_context(profile=profile)
        assert ctx.arena.nbytes == 0 and ctx.arena.block is None and ctx.arena.buffers is None
        for batch in (16, 4, 16, 1 if profile == "auto" else 5):  # profile 1's max, then smaller, then max again
            x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
            got = ctx.run({"x": x})["y"]
            assert got.shape == (batch, 3)
            np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        assert ctx.arena.nbytes == 0  # nothing grew or was reallocated in the arena


def _static_relu() -> Network:
    net = Network("n")
    net.add_tensor("x", DType.FLOAT32, (4, 8))
    net.inputs = ["x"]
    net.add_tensor("r", DType.FLOAT32, (4, 8))
    net.add_tensor("y", DType.FLOAT32, (4, 8))
    net.layers = [Layer("relu", "Relu", ["x"], ["r"]), Layer("neg", "Neg", ["r"], ["y"])]
    net.outputs = ["y"]
    return net


@pytest.fixture
def out_tactic(monkeypatch):
    """A CPU tactic for Relu whose kernel writes into the arena buffer it is handed, as the GPU's do."""
    registry.get(registry.REFERENCE)  # the library loaded first

    def compile(spec, config, device):
        def run(inputs, out=None):
            if out is None or out[0] is None:  # not placed: its own memory
                return [torch.relu(inputs[0])]
            view = out[0][:inputs[0].numel() * 4].view(torch.float32).view(inputs[0].shape)
            torch.clamp(inputs[0], min=0, out=view)
            return [view]
        return run

    tactic = registry.Tactic("test_relu_out", ("Relu",), compile, backends=("cpu",), writes_out=True, fresh=True)
    monkeypatch.setitem(registry.TACTICS, tactic.name, tactic)
    return tactic


def test_one_plan_places_an_output_only_where_every_profile_writes_it(out_tactic):
    net = _static_relu()
    fixed = {"x": ((4, 8), (4, 8), (4, 8))}
    config = kiln.BuildConfig(device="cpu", profiles=(fixed, fixed))
    out = {"relu": Choice(out_tactic.name), "neg": Choice(registry.REFERENCE)}
    ref = {"relu": Choice(registry.REFERENCE), "neg": Choice(registry.REFERENCE)}
    x = torch.randn(4, 8)
    both = Engine(net, config, CPU, tactics=out, profile_tactics=[out, dict(out)])
    assert both.compiled["relu"] is out_tactic and "r" in both.memory_plan.offsets
    assert both.memory_plan.arena_bytes >= 4 * 8 * 4
    mixed = Engine(net, config, CPU, tactics=out, profile_tactics=[out, ref])
    assert mixed.compiled["relu"] is out_tactic and mixed.kernels_for(1)[0] is not mixed.kernels_for(0)[0]
    assert mixed.memory_plan.offsets == {}  # profile 1's reference takes no buffer: not placed for any profile
    for engine in (both, mixed):
        assert Arena(engine).nbytes == (engine.memory_plan.arena_bytes or 0)
        for profile in (0, 1):
            got = engine.create_context(profile=profile).run({"x": x})["y"]
            torch.testing.assert_close(got, -torch.relu(x))
