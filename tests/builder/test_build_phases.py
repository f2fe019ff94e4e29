"""Where build time goes: the phase recorder, the build's breakdown (build_info["build_phases"] / ["build_counts"])
and the autotuner's counts (candidates compiled, rejected, timed; timing cache hits and misses)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import kiln
from kiln.builder import autotune
from kiln.builder.autotune import Autotuner
from kiln.builder.timing_cache import TimingCache
from kiln.tactics import registry
from kiln.tactics.spec import layer_spec
from kiln.util.phases import PhaseTimes
from cli.test_cli import tiny_model


def test_phases_record_exclusive_time_and_splits_move_it():
    p = PhaseTimes()
    with p.phase("outer"):
        time.sleep(0.02)
        with p.phase("inner"):
            time.sleep(0.03)
    assert p.seconds["inner"] >= 0.03 and 0.02 <= p.seconds["outer"] < 0.03 + 0.02  # outer less inner
    with p.phase("inner"):  # phases accumulate
        pass
    p.split("outer", "outer: part", 0.01)
    p.split("outer", "outer: more", 10.0)  # never more than the phase holds
    assert p.seconds["outer"] == 0.0 and p.seconds["outer: part"] == pytest.approx(0.01)
    p.count("things")
    p.count("things", 2)
    assert p.to_json()["counts"] == {"things": 3} and list(p.to_json()["seconds"])[:2] == ["outer", "inner"]


def test_a_build_accounts_for_most_of_its_time(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    kiln.build(str(model), kiln.BuildConfig(device="cpu"))  # first build of the process: lazy imports
    start = time.perf_counter()
    engine = kiln.build(str(model), kiln.BuildConfig(device="cpu", fp16=True))
    wall = time.perf_counter() - start
    info = engine.build_info
    phases, total = info["build_phases"], info["build_seconds"]
    assert {"load", "import", "optimize", "specialize", "precision", "tune: other", "engine: kernels",
            "engine: memory plan"} <= set(phases)
    assert all(isinstance(s, float) and s >= 0 for s in phases.values())
    assert 0.5 * total <= sum(phases.values()) <= total + 1e-5 and total <= wall
    counts = info["build_counts"]
    assert counts["layers"] == len(engine.network.layers)
    assert counts.get("layers tuned", 0) == 0  # the CPU backend tunes nothing: no candidates, no timing phases
    assert not {"tune: compile + check", "tune: timing", "calibration"} & set(phases)


class _Tactic:
    """A stand-in tactic: configs 0 and 1 run the reference, config 2 is wrong by one."""

    name, untimed, superseded_by = "fake", False, ()

    def configs(self, spec, device, level):
        return [{"c": 0}, {"c": 1}, {"c": 2}]

    def compile(self, spec, config, device):
        ref = registry.reference_kernel(spec)
        return ref if config["c"] < 2 else (lambda xs: [o + 1 for o in ref(xs)])


class _Device:
    backend, torch_device, hardware_compat = "cpu", "cpu", "none"

    def fingerprint(self):
        return {"name": "fake"}


def test_autotuner_counts_are_consistent(tmp_path, monkeypatch):
    engine = kiln.build(str(tiny_model(tmp_path / "tiny.onnx")), kiln.BuildConfig(device="cpu",
                                                                                    profiles=({"x": _fixed()},)))
    net = engine.network
    specs = [layer_spec(net, layer, engine.weights, False) for layer in net.layers]
    assert all(s.static for s in specs)
    monkeypatch.setattr(autotune, "device_time_us", lambda kernel, args, repeats, cutoff_us=None: 1.0)
    monkeypatch.setattr(registry, "candidates", lambda spec, device: ([_Tactic()], []))
    phases = PhaseTimes()
    tuner = Autotuner(_Device(), 3, False, TimingCache(tmp_path / "timing.cache"), phases=phases)
    with torch.no_grad():
        first = [tuner.choose(s) for s in specs]
        again = [Autotuner(_Device(), 3, False, tuner.cache, phases=phases).choose(s)  # another build's tuner:
                 for s in specs]                                                       # from the timing cache
    assert all(c.source == "timed" and len(c.timed) == 2 for c in first)
    assert all(c.source == "cache" for c in again)
    n = len(specs)
    assert phases.counts == {"timing cache misses": n, "layers tuned": n, "candidates compiled": 3 * n,
                             "candidates rejected": n, "candidates timed": 2 * n, "timing cache hits": n}
    c = phases.counts
    assert c["candidates timed"] + c["candidates rejected"] <= c["candidates compiled"]
    assert c["layers tuned"] + c["timing cache hits"] == 2 * n
    assert {"tune: reference", "tune: compile + check", "tune: timing"} <= set(phases.seconds)


def test_busy_seconds_add_up_across_threads_and_list_the_costliest_first():
    p = PhaseTimes()
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: p.tally("a" if i % 4 else "b", 0.5), range(400)))
    assert p.to_json()["busy"] == {"a": 150.0, "b": 50.0} and list(p.to_json()["busy"]) == ["a", "b"]


def test_the_autotuner_tallies_each_tactics_compile_and_check_time(tmp_path, monkeypatch):
    engine = kiln.build(str(tiny_model(tmp_path / "tiny.onnx")), kiln.BuildConfig(device="cpu",
                                                                                    profiles=({"x": _fixed()},)))
    spec = layer_spec(engine.network, engine.network.layers[0], engine.weights, False)
    monkeypatch.setattr(autotune, "device_time_us", lambda kernel, args, repeats, cutoff_us=None: 1.0)
    monkeypatch.setattr(registry, "candidates", lambda spec, device: ([_Tactic()], []))
    slow = _Tactic.compile

    def compile_slowly(self, spec, config, device):
        time.sleep(0.01)
        return slow(self, spec, config, device)

    monkeypatch.setattr(_Tactic, "compile", compile_slowly)
    phases = PhaseTimes()
    with torch.no_grad():
        Autotuner(_Device(), 3, False, None, phases=phases).choose(spec)
    assert set(phases.busy) == {"fake"} and phases.busy["fake"] >= 3 * 0.01  # three configs, each compiled


def test_a_layer_identical_to_one_tuned_is_not_tuned_again(tmp_path, monkeypatch):
    """Without a timing cache too: the second of two identical layers takes the first's choice and layout timings."""
    engine = kiln.build(str(tiny_model(tmp_path / "tiny.onnx")), kiln.BuildConfig(device="cpu",
                                                                                    profiles=({"x": _fixed()},)))
    spec = layer_spec(engine.network, engine.network.layers[0], engine.weights, False)
    twin = layer_spec(engine.network, engine.network.layers[0], engine.weights, False)
    twin = type(twin)("twin", twin.kind, twin.attrs, twin.inputs, twin.outputs)
    assert twin.signature() == spec.signature()
    times = iter([3.0, 2.0])
    monkeypatch.setattr(autotune, "device_time_us", lambda kernel, args, repeats, cutoff_us=None: next(times))
    monkeypatch.setattr(registry, "candidates", lambda spec, device: ([_Tactic()], []))
    phases = PhaseTimes()
    tuner = Autotuner(_Device(), 3, False, None, phases=phases)
    tuner.by_layout[spec.name] = {"nhwc": (2.0, "fake", {"c": 1})}  # as _measure records a layout's best
    with torch.no_grad():
        first = tuner.choose(spec)
        second = tuner.choose(twin)  # a third timing would exhaust `times`
    assert (second.tactic, second.config, second.microseconds, second.timed) == \
        (first.tactic, first.config, first.microseconds, first.timed) and second is not first
    assert phases.counts["layers tuned"] == 1 and phases.counts["identical layers reused"] == 1
    assert tuner.by_layout["twin"] == tuner.by_layout[spec.name]


class _AlphaTactic:
    """Config 0: the fast one, right only for alpha ≥ 0.4 (as a kernel may hold only some layers' scales); config 1
    the reference."""

    name, untimed, superseded_by = "alpha", False, ()

    def configs(self, spec, device, level):
        return [{"c": 0}, {"c": 1}]

    def compile(self, spec, config, device):
        alpha = spec.attrs["alpha"]
        return registry.reference_kernel(spec) if config["c"] else (
            lambda xs: [torch.nn.functional.leaky_relu(xs[0], alpha if alpha >= 0.4 else 0.5)])


def _leaky(name: str, alpha: float):
    from kiln.ir import DType
    from kiln.tactics.spec import LayerSpec, ValueSpec

    v = ValueSpec(DType.FLOAT32, (16, 64))  # enough random values that some are negative, whatever the seed
    return LayerSpec(name, "LeakyRelu", {"alpha": alpha}, (v,), (v,))


@pytest.mark.parametrize("alpha, reused", [(0.4, True), (0.25, False)])
def test_a_layer_differing_only_in_a_float_attribute_reuses_the_choice_once_it_passes_the_check(
        monkeypatch, alpha, reused):
    """int8 layers of one shape differ in their scales: the second takes the first's choice after one check at its
    own values, and is tuned in full when that check fails."""
    first, second = _leaky("a", 0.5), _leaky("b", alpha)
    assert first.shape_signature() == second.shape_signature() and first.signature() != second.signature()
    assert _leaky("c", 0.5).signature() == first.signature() and first.shape_signature() != \
        type(first)("d", "LeakyRelu", {"alpha": 0.5}, first.inputs, first.outputs, tf32=True).shape_signature()
    monkeypatch.setattr(autotune, "device_time_us",
                        lambda kernel, args, repeats, cutoff_us=None: 1.0 if kernel.__name__ == "<lambda>" else 2.0)
    monkeypatch.setattr(registry, "candidates", lambda spec, device: ([_AlphaTactic()], []))
    phases = PhaseTimes()
    tuner = Autotuner(_Device(), 3, False, None, phases=phases)
    with torch.no_grad():
        a, b = tuner.choose(first), tuner.choose(second)
    assert a.config == {"c": 0}
    if reused:
        assert b.config == {"c": 0} and b.timed == a.timed
        assert phases.counts["layers tuned"] == 1 and phases.counts["same-shape layers reused (checked)"] == 1
        assert phases.counts["candidates compiled"] == 3  # two for the first layer, one check for the second
    else:
        assert b.config == {"c": 1} and len(b.timed) == 1 and ("alpha{'c': 0}", ) == b.rejected[0][:1]
        assert phases.counts["layers tuned"] == 2 and "same-shape layers reused (checked)" not in phases.counts


def _fixed():
    return kiln.ShapeRange.fixed((2, 4))


def test_calibration_is_its_own_phase(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    calib = [{"x": np.random.default_rng(0).random((8, 4), np.float32)}]
    engine = kiln.build(str(model), kiln.BuildConfig(device="cpu", int8=True), calib_data=calib)
    phases = engine.build_info["build_phases"]
    assert phases["calibration"] > 0 and list(phases).index("precision") < list(phases).index("calibration")
    assert sum(phases.values()) <= engine.build_info["build_seconds"] + 1e-5


@pytest.mark.parametrize("first_us, cutoff_us", [(500.0, autotune.CUTOFF * 500.0), (5.0, autotune.CUTOFF_FLOOR_US)])
def test_later_candidates_are_timed_against_a_cutoff_of_three_times_the_best(tmp_path, monkeypatch, first_us,
                                                                            cutoff_us):
    """The first timed candidate of a layer runs in full; each later one gets a cutoff of CUTOFF x the best so far,
    never under CUTOFF_FLOOR_US (a single run of a few-µs kernel is all launch jitter)."""
    engine = kiln.build(str(tiny_model(tmp_path / "tiny.onnx")), kiln.BuildConfig(device="cpu",
                                                                                    profiles=({"x": _fixed()},)))
    spec = layer_spec(engine.network, engine.network.layers[0], engine.weights, False)
    cutoffs, times = [], iter([first_us, 2.0])

    def timed(kernel, args, repeats, cutoff_us=None):
        cutoffs.append(cutoff_us)
        return next(times)

    monkeypatch.setattr(autotune, "device_time_us", timed)
    monkeypatch.setattr(registry, "candidates", lambda spec, device: ([_Tactic()], []))
    with torch.no_grad():
        choice = Autotuner(_Device(), 3, False, None).choose(spec)
    assert cutoffs == [None, cutoff_us] and choice.microseconds == 2.0
