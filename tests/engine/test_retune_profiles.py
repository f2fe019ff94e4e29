"""`kiln retune` / `kiln.load(policy="retune")` of a multi-profile plan re-tunes every optimization profile (as the
build does, through `tune_profiles` at each profile's shapes) and keeps one tactic table per profile (issue 23)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort

import kiln
from kiln.engine import retune as retune_mod
from kiln.tactics import registry
from kiln.tactics.choice import Choice
from test_cli import invoke
from test_engine_profiles import LARGE, SMALL, dynamic_model
from test_fuzz import _split

BATCHES = (1, 3, 4, 9, 16)  # in profile 0, both, and profile 1


def _plan(tmp_path):
    engine = kiln.build(dynamic_model(), kiln.BuildConfig(device="cpu", profiles=(SMALL, LARGE)))
    return engine, engine.save(tmp_path / "two.plan")


def _check_outputs(engine, original):
    session = ort.InferenceSession(dynamic_model(), providers=["CPUExecutionProvider"])
    for batch in BATCHES:
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        got = engine.create_context().run({"x": x})["y"]
        np.testing.assert_array_equal(got, original.run({"x": x})["y"])
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        for profile in (0, 1):
            if engine.config.profiles[profile]["x"].contains((batch, 4)):
                ctx = engine.create_context(profile=profile)
                np.testing.assert_array_equal(ctx.run({"x": x})["y"], got)


def test_retune_tunes_every_profile_and_the_plan_keeps_each_table(tmp_path, monkeypatch):
    original, path = _plan(tmp_path)
    real, seen = retune_mod.tune_profiles, {}
    layer = original.network.layers[0].name
    mark = Choice(registry.REFERENCE, {"retuned": "profile 1"}, 2.5, "timed")

    def spy(net, weights, device, level, tf32, cache, progress, workspace, profile_shapes, **kw):
        seen["profiles"] = len(profile_shapes)
        out = real(net, weights, device, level, tf32, cache, progress, workspace, profile_shapes, **kw)
        out[1] = dict(out[1], **{layer: mark})  # as a GPU re-tune choosing another kernel for profile 1
        return out

    monkeypatch.setattr(retune_mod, "tune_profiles", spy)
    tuned = kiln.Engine.load(path, "retune", force_retune=True)
    assert seen["profiles"] == 2
    assert tuned.profile_count == 2 and tuned.profile_tactics[1][layer] == mark
    assert tuned.profile_tactics[0][layer] != mark and tuned.kernels_for(1)[0] is not tuned.kernels_for(0)[0]
    info = tuned.build_info["retune"]
    assert info["profiles"] == 2 and info["changed"] == 1 and info["layers"] == len(tuned.network.layers)
    _check_outputs(tuned, original)

    saved = tuned.save(tmp_path / "retuned.plan")
    _, manifest, _ = _split(saved.read_bytes())
    assert len(manifest["profile_tactics"]) == 1 and list(manifest["profile_tactics"][0]) == [layer]
    again = kiln.load(saved)
    assert again.profile_count == 2 and again.profile_tactics[1][layer] == mark
    _check_outputs(again, original)


def test_retune_keeps_a_plans_own_profile_tables_apart_from_profile_0(tmp_path, monkeypatch):
    """Re-tuning tells changes per profile: a profile-1 choice the re-tune replaces counts as changed."""
    built, _ = _plan(tmp_path)
    layer = built.network.layers[0].name
    other = dict(built.tactics) | {layer: Choice(registry.REFERENCE, {"tuned": "elsewhere"}, 1.0, "timed")}
    engine = kiln.Engine(built.network, built.config, built.device, tactics=built.tactics,
                         profile_tactics=[built.tactics, other])
    path = engine.save(tmp_path / "mixed.plan")
    tuned = kiln.Engine.load(path, "retune", force_retune=True)
    assert tuned.profile_count == 2 and tuned.build_info["retune"]["changed"] == 1  # profile 1's layer, re-tuned
    assert tuned.profile_tactics[1][layer].tactic == registry.REFERENCE and not tuned.profile_tactics[1][layer].config
    _check_outputs(tuned, built)


def test_cli_retune_of_a_two_profile_plan(tmp_path):
    original, path = _plan(tmp_path)
    out = tmp_path / "r.plan"
    result = invoke("retune", str(path), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["profiles"] == 2 and summary["layers"] == len(original.network.layers)
    tuned = kiln.load(out)
    assert tuned.profile_count == 2 and tuned.config.profiles == original.config.profiles
    _check_outputs(tuned, original)
    text = invoke("retune", str(path), "-o", str(tmp_path / "r2.plan"))
    assert text.exit_code == 0 and "optimization profiles" in text.output
