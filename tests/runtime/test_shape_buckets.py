"""Shape buckets (issue 23): `BuildConfig(shape_buckets=N)` splits each dynamic profile along the batch into up to N
contiguous profiles, each tuned at its own opt shape, picked by the input shapes as any other profile."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import kiln
from kiln.config import ShapeRange, bucket_bounds, bucket_notes, split_profile
from kiln.errors import ConfigError
from test_engine_profiles import dynamic_model


@pytest.mark.parametrize("lo, hi, n, want", [
    (1, 64, 3, [(1, 3), (4, 15), (16, 64)]),
    (1, 2, 4, [(1, 1), (2, 2)]),               # narrower than N: the empty buckets merge away
    (16, 16, 3, [(16, 16)]),                   # fixed: nothing to split
    (0, 64, 3, [(0, 3), (4, 15), (16, 64)]),   # 0 starts like 1
    (8, 16, 3, [(8, 9), (10, 12), (13, 16)]),
    (1, 64, 1, [(1, 64)]),
    (1, 3, 16, [(1, 1), (2, 2), (3, 3)]),
])
def test_bucket_bounds(lo, hi, n, want):
    assert bucket_bounds(lo, hi, n) == want


@pytest.mark.parametrize("lo, hi, n", [(1, 64, 3), (1, 2, 4), (0, 5, 16), (3, 1000, 16), (7, 9, 2), (1, 2**40, 16)])
def test_buckets_cover_the_range_once_and_hold_their_opt(lo, hi, n):
    p = {"x": ShapeRange((lo, 4), (hi, 4), (hi, 4)), "k": ShapeRange.fixed((2,))}
    bounds = bucket_bounds(lo, hi, n)
    assert len(bounds) in range(1, n + 1) and bounds[0][0] == lo and bounds[-1][1] == hi
    assert all(a <= b for a, b in bounds) and all(b + 1 == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
    for batch in range(lo, min(hi, 2000) + 1):
        assert sum(a <= batch <= b for a, b in bounds) == 1
    buckets = split_profile(p, n)
    assert sorted((b["x"].min[0], b["x"].max[0]) for b in buckets) == bounds
    for b in buckets:
        assert b["x"].min[0] <= b["x"].opt[0] <= b["x"].max[0] and b["x"].opt[1] == 4 and b["k"] == p["k"]


def test_split_takes_the_users_opt_in_its_bucket_first_and_the_max_elsewhere():
    config = kiln.BuildConfig(profiles=[{"x": ((1, 4), (8, 4), (64, 4)), "y": ((1, 2), (8, 2), (64, 2)),
                                         "k": ((2,), (2,), (2,))}], shape_buckets=3)
    assert [(p["x"].min, p["x"].opt, p["x"].max) for p in config.profiles] == [
        ((4, 4), (8, 4), (15, 4)), ((1, 4), (3, 4), (3, 4)), ((16, 4), (64, 4), (64, 4))]
    assert all(p["y"].min[0] == p["x"].min[0] and p["y"].max[0] == p["x"].max[0] for p in config.profiles)
    assert all(p["k"] == ShapeRange.fixed((2,)) for p in config.profiles)
    assert config.profile_buckets == ((0, 0, ("x", "y")),) * 3
    assert bucket_notes(config) == ["shape buckets: profile 0 split along the batch (dim 0 of x, y) into 3 profiles, "
                                    "each tuned at its opt: 0: 4..15 (opt 8), 1: 1..3 (opt 3), 2: 16..64 (opt 64)"]
    again = kiln.BuildConfig.from_json(config.to_json())  # a plan's config is not split again
    assert again == config and len(again.profiles) == 3


def test_split_falls_back_to_the_first_varying_dim_and_leaves_static_profiles_whole():
    config = kiln.BuildConfig(profiles=[{"x": ((2, 8), (2, 32), (2, 128))}, {"x": ((2, 4), (2, 4), (2, 4))}],
                              shape_buckets=2)
    assert [p["x"].min for p in config.profiles] == [(2, 32), (2, 8), (2, 4)]  # opt 32's bucket first
    assert [p["x"].max for p in config.profiles] == [(2, 128), (2, 31), (2, 4)]
    notes = bucket_notes(config)
    assert "dim 1 of x (no input's dim 0 varies)" in notes[0] and "profile 1 is static, not split" in notes[1]


@pytest.mark.parametrize("kw, why", [
    (dict(shape_buckets=0), "shape_buckets \\(--shape-buckets\\) must be 1..16, got 0"),
    (dict(shape_buckets=17), "must be 1..16, got 17"),
    (dict(shape_buckets=2.0), "shape_buckets=2.0: expected an int"),
    (dict(shape_buckets=True), "shape_buckets=True: expected an int"),
    (dict(shape_buckets=3), "no optimization profile; shape buckets .* --profile MIN OPT MAX or --min-shapes"),
    (dict(shape_buckets=3, profiles=[{"x": ((16, 4), (16, 4), (16, 4))}]), "no optimization profile has a varying"),
    (dict(profiles=[{"x": ((1, 4), (2, 4), (4, 4))}], profile_buckets=((0, 0, ("x",)),) * 2), "profile_buckets"),
])
def test_bad_shape_buckets_are_config_errors(kw, why):
    with pytest.raises(ConfigError, match=why):
        kiln.BuildConfig(**kw)


def test_bucketed_engine_picks_the_bucket_and_matches_onnx_runtime(tmp_path):
    model = dynamic_model()
    engine = kiln.build(model, kiln.BuildConfig(device="cpu", shape_buckets=3,
                                                profiles=[{"x": ((1, 4), (8, 4), (64, 4))}]))
    assert engine.profile_count == 3
    assert [engine.select_profile({"x": (b, 4)}) for b in (1, 3, 4, 10, 15, 16, 64)] == [1, 1, 0, 0, 0, 2, 2]
    assert engine.build_info["shape_buckets"] == [{"profile": 0, "dim": 0, "inputs": ["x"], "profiles": [0, 1, 2]}]
    assert any(n.startswith("shape buckets: profile 0 split") for n in engine.build_info["notes"])
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    loaded = kiln.load(engine.save(tmp_path / "b.plan"))
    assert loaded.profile_count == 3 and loaded.config == engine.config
    for batch in (1, 10, 64):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        want = session.run(None, {"x": x})[0]
        for e in (engine, loaded):
            np.testing.assert_allclose(e.create_context().run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
