"""The autotuner's candidate checks on a thread pool (KILN_COMPILE_THREADS > 1): the same results in the same order
as one at a time, several threads used, probe failures reported per candidate; opt level 0 and a workspace limit
keep checking one at a time. Fake tactics on the CPU (the pool itself is device-agnostic)."""

import os
import threading
import time

import pytest
import torch

from kiln.builder.autotune import Autotuner, env_compile_threads
from kiln.ir import DType
from kiln.tactics.registry import Tactic
from kiln.tactics.spec import LayerSpec, ValueSpec
from kiln.target.device import Device

CPU = Device("cpu", "cpu", "cpu")
SPEC = LayerSpec("l", "Relu", {}, (ValueSpec(DType.FLOAT32, (4, 8)),), (ValueSpec(DType.FLOAT32, (4, 8)),))


def _tactics(threads: set, plans_per_shape: bool = False):
    """Configs 0..5: even ones right, odd ones wrong (negated); each records its thread and sleeps like a compile."""
    def compile_(spec, config, device):
        def run(inputs):
            threads.add(threading.get_ident())
            time.sleep(0.05)
            y = torch.relu(inputs[0])
            return [y if config["i"] % 2 == 0 else -y - 1]
        return run

    return [Tactic("fake", ("Relu",), compile_, configs=lambda spec, device, level: [{"i": i} for i in range(6)],
                   plans_per_shape=plans_per_shape)]


def _run(threads_wanted: int, level: int = 3, workspace=None, probes=(), plans_per_shape=False):
    seen: set = set()
    tuner = Autotuner(CPU, level, False, None, workspace, compile_threads=threads_wanted)
    ref = tuner._reference(SPEC)
    others = [(what, p, tuner._reference(p)) for what, p in probes]
    todo = [(t, c) for t in _tactics(seen, plans_per_shape) for c in t.configs(SPEC, CPU, level)]
    out = [(c["i"], why is None) for _, c, _, why in tuner._checked(todo, SPEC, ref, others)]
    return out, seen


def test_pool_matches_one_at_a_time_and_uses_threads():
    serial, serial_threads = _run(1)
    pooled, pooled_threads = _run(4)
    assert pooled == serial == [(i, i % 2 == 0) for i in range(6)]
    assert len(serial_threads) == 1 and len(pooled_threads) > 1


def test_tactics_that_plan_per_shape_are_checked_on_the_calling_thread():
    """cuDNN caches its plans per thread: its candidates are checked where they will be timed and run."""
    pooled, seen = _run(4, plans_per_shape=True)
    assert pooled == [(i, i % 2 == 0) for i in range(6)]
    assert seen == {threading.get_ident()}


def test_probe_failure_names_the_shape():
    """Config 1 is right at the tuning shape and raises at the profile's max shape: rejected, the shape named."""
    def compile_(spec, config, device):
        def run(inputs):
            if config["i"] == 1 and inputs[0].shape != (4, 8):
                raise RuntimeError("no kernel for this shape")
            return [torch.relu(inputs[0])]
        return run

    fake = Tactic("fake", ("Relu",), compile_, configs=lambda spec, device, level: [{"i": 0}, {"i": 1}])
    bigger = LayerSpec("l", "Relu", {}, (ValueSpec(DType.FLOAT32, (2, 3)),), (ValueSpec(DType.FLOAT32, (2, 3)),))
    tuner = Autotuner(CPU, 3, False, None, compile_threads=4)
    others = [("profile 0 max shapes", bigger, tuner._reference(bigger))]
    todo = [(fake, c) for c in fake.configs(SPEC, CPU, 3)]
    whys = [why for *_, why in tuner._checked(todo, SPEC, tuner._reference(SPEC), others)]
    assert whys[0] is None and whys[1].startswith("fails at profile 0 max shapes: failed: RuntimeError")


@pytest.mark.parametrize("level,workspace", [(0, None), (3, 1 << 20)])
def test_level0_and_workspace_limits_check_one_at_a_time(level, workspace):
    _, seen = _run(4, level=level, workspace=workspace)
    assert len(seen) == 1
    assert "compile threads" not in Autotuner(CPU, level, False, None, workspace, compile_threads=4).phases.counts


def test_thread_count_is_reported():
    assert Autotuner(CPU, 3, False, None, compile_threads=4).phases.counts["compile threads"] == 4


def test_env_setting(monkeypatch):
    monkeypatch.delenv("KILN_COMPILE_THREADS", raising=False)
    assert env_compile_threads("cpu") == 1
    for usable, want in ((range(2), 2), (range(16), 8)):  # the CPUs this process may run on, at most 8
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cpus=set(usable): cpus, raising=False)
        assert env_compile_threads("cuda") == want
    monkeypatch.setenv("KILN_COMPILE_THREADS", "6")
    assert env_compile_threads("cpu") == env_compile_threads("cuda") == 6
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("KILN_COMPILE_THREADS", bad)
        assert env_compile_threads("cpu") == 1


@pytest.mark.gpu
def test_gpu_build_with_a_pool_matches_one_at_a_time(monkeypatch, tmp_path):
    """A real fp16 build (cuBLASLt, Triton and cuDNN candidates) with 4 threads: the same candidates checked and the
    same outputs as with one."""
    import numpy as np
    import onnx
    from onnx import TensorProto as T, helper, numpy_helper

    import kiln

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["g"]),
             helper.make_node("Gelu", ["g"], ["y"], domain="")]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.1, "w"),
             numpy_helper.from_array(rng.standard_normal((16 * 8 * 8, 64)).astype(np.float32) * 0.02, "m")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [4, 8, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4, 64])], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), path)
    x = rng.standard_normal((4, 8, 8, 8)).astype(np.float32)
    outs, counts = [], []
    for threads in ("1", "4"):
        monkeypatch.setenv("KILN_COMPILE_THREADS", threads)
        engine = kiln.build(str(path), kiln.BuildConfig(device="cuda", fp16=True))
        outs.append(engine.create_context().run({"x": x})["y"])
        counts.append(engine.build_info["build_counts"]["candidates compiled"])
    assert counts[0] == counts[1] > 1
    np.testing.assert_allclose(outs[0], outs[1], rtol=2e-2, atol=2e-2)


def _prefetch_run(monkeypatch, prefetch: bool, short_of_memory: bool = False, progress=lambda *a: None):
    """Three layers, the second identical to the first; every check and timing recorded in order."""
    from kiln.builder import autotune
    from kiln.tactics import registry

    events: list = []

    def compile_(spec, config, device):
        def run(inputs):
            events.append(("check", spec.name, config["i"]))
            y = torch.relu(inputs[0])
            return [y if config["i"] % 2 == 0 else -y - 1]
        return run

    tactic = Tactic("fake", ("Relu",), compile_, configs=lambda spec, device, level: [{"i": i} for i in range(4)])
    monkeypatch.setattr(registry, "candidates", lambda spec, device: ([tactic], []))
    monkeypatch.setattr(autotune, "device_time_us", lambda kernel, args, repeats, cutoff_us=None:
                        events.append(("time",)) or 1.0)
    monkeypatch.setattr(autotune, "_short_of_memory", lambda device: short_of_memory)
    small = LayerSpec("c", "Relu", {}, (ValueSpec(DType.FLOAT32, (2, 8)),), (ValueSpec(DType.FLOAT32, (2, 8)),))
    specs = [SPEC, LayerSpec("b", *[getattr(SPEC, f) for f in ("kind", "attrs", "inputs", "outputs")]), small]
    tuner = Autotuner(CPU, 3, False, None, compile_threads=4)
    if prefetch:
        tuner.prefetch(specs, progress)
        assert len(tuner.prefetched) == (0 if short_of_memory else 2)  # the twin of the first is not prefetched
    with torch.no_grad():
        choices = [tuner.choose(s) for s in specs]
    assert not tuner.prefetched
    return [(c.tactic, c.config, len(c.timed), len(c.rejected)) for c in choices], events, tuner.phases.counts


def test_prefetch_checks_every_layer_before_timing_any_and_chooses_the_same(monkeypatch):
    plain, plain_events, plain_counts = _prefetch_run(monkeypatch, prefetch=False)
    ahead, events, counts = _prefetch_run(monkeypatch, prefetch=True)
    assert ahead == plain == [("fake", {"i": 0}, 2, 2)] * 3
    assert counts == plain_counts and counts["identical layers reused"] == 1 and counts["layers tuned"] == 2
    first_time = events.index(("time",))
    assert all(e[0] == "check" for e in events[:first_time]) and len(events[:first_time]) == 8  # 2 layers x 4
    assert ("check", "b", 0) not in events
    assert plain_events.index(("time",)) == 4  # without it, the first layer is timed before the next is checked


def test_prefetch_stops_when_the_gpu_is_short_of_memory(monkeypatch):
    plain, *_ = _prefetch_run(monkeypatch, prefetch=False)
    ahead, events, _ = _prefetch_run(monkeypatch, prefetch=True, short_of_memory=True)
    assert ahead == plain and events.index(("time",)) == 4


def test_prefetch_reports_its_progress_on_the_calling_thread(monkeypatch):
    heard = []
    _prefetch_run(monkeypatch, prefetch=True,
                  progress=lambda stage, done, total: heard.append((stage, done, total, threading.get_ident())))
    assert heard and {h[0] for h in heard} == {"tune: compile + check"} and {h[3] for h in heard} == \
        {threading.get_ident()}
    done = [h[1] for h in heard]
    assert done == sorted(done) and done[-1] == heard[-1][2] == 8  # two layers' four candidates
