"""Calibrators against hand-computed scales, batch-size independence, calibration data and the cache file."""

import json

import numpy as np
import pytest
import torch

import kiln
from kiln.errors import ConfigError, InputError
from kiln.quant import calib_cache, calibrators
from kiln.quant.histogram import BINS, Histogram


def _hist(*chunks) -> Histogram:
    h = Histogram()
    for c in chunks:
        h.add(torch.as_tensor(c, dtype=torch.float32))
    return h


def amax(name, h, p=99.99):
    return calibrators.get(name).amax(h, p)


def test_minmax_is_the_exact_largest_magnitude():
    assert amax("minmax", _hist([0.5, -3.25, 2.0], [1.0])) == 3.25


def test_histogram_range_is_a_power_of_two_and_merges_exactly():
    h = _hist([0.75], [5.0, 0.0])           # R grows 1 → 8: bin width 8/2048
    assert h.exp == 3 and h.width == 8 / BINS
    counts, _ = h.numpy()
    assert counts[int(0.75 / h.width)] == 1 and counts[int(5.0 / h.width)] == 1 and counts[0] == 1
    assert counts.sum() == 3


def test_percentile_picks_the_upper_edge_of_the_bin_holding_it():
    # 10000 values 1..10000 (R = 16384, width 8): the 99.99th percentile value is 9999, in bin 1249
    h = _hist(np.arange(1, 10001, dtype=np.float32))
    assert h.width == 8.0
    assert amax("percentile", h, 99.99) == 1250 * 8.0
    assert amax("percentile", h, 50.0) == 626 * 8.0  # value 5000 lies in bin 625


def test_entropy_keeps_the_whole_range_of_a_compact_distribution():
    assert amax("entropy", _hist(np.full(100, -3.0))) == 3.0         # one magnitude: KL is 0 only there
    g = np.random.default_rng(0)
    b = amax("entropy", _hist(g.uniform(-1, 1, 100_000).astype(np.float32)))
    assert 0.99 <= b <= 1.0, b                                       # uniform: no clipping is best


def test_entropy_and_mse_clip_the_tail_of_a_normal_distribution():
    g = np.random.default_rng(0)
    h = _hist(g.normal(0, 1, 200_000).astype(np.float32))           # max ≈ 4.73σ
    assert 3.5 <= amax("entropy", h) <= 4.3 and 3.5 <= amax("mse", h) <= 4.3
    assert amax("minmax", h) == h.amax > 4.5


def test_mse_is_the_least_squared_error_edge():
    # half the values 0.5, half 1.0: amax = 1.0 puts 0.5 at level 63.5 (a rounding error), a slightly
    # smaller amax does better; the choice must be the brute-force minimum over the candidate edges
    h = _hist(np.r_[np.full(1000, 0.5), np.full(1000, 1.0)].astype(np.float32))
    a = amax("mse", h)
    counts, w = h.numpy()
    used = int(np.nonzero(counts)[0][-1]) + 1

    def err(am):
        s = am / 127
        c = (np.arange(BINS) + 0.5) * w
        return float((counts * (np.minimum(np.round(c / s), 127) * s - c) ** 2).sum())

    assert a < 1.0 and err(a) < err(1.0)
    assert err(a) == min(err(k * w) for k in range(1, used + 1))


@pytest.mark.parametrize("name", list(calibrators.CALIBRATORS))
def test_scales_do_not_depend_on_batch_size(name):
    g = np.random.default_rng(2)
    data = (g.standard_t(3, size=(64, 100)) * np.linspace(0.1, 3, 64)[:, None]).astype(np.float32)
    one = _hist(*[data[i:i + 1] for i in range(64)])
    eight = _hist(*[data[i:i + 8] for i in range(0, 64, 8)])
    assert np.array_equal(one.numpy()[0], eight.numpy()[0])
    assert amax(name, one) == amax(name, eight)


def _model(tmp_path):
    torch.manual_seed(0)
    from models.export import export

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(8 * 6 * 6, 4))
    return export(m, (torch.randn(1, 3, 6, 6),), tmp_path / "m.onnx", dynamo=False, input_names=["x"],
                  output_names=["y"], dynamic_axes={"x": {0: "b"}})


def test_build_calibrates_with_batch_1_and_8_to_the_same_scales_and_reuses_the_cache(tmp_path):
    path = _model(tmp_path)
    x = np.random.default_rng(3).normal(size=(16, 3, 6, 6)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    engines = [kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "calib.npz"),
                                                 calib_batch=b, calib_cache=str(tmp_path / f"c{b}.json")))
               for b in (1, 8)]
    t1, t8 = (e.build_info["int8"]["tensors"] for e in engines)
    # the same scales; the observed max may differ in the last bit (the conv sums in another order per batch)
    assert {n: v["scale"] for n, v in t1.items()} == {n: v["scale"] for n, v in t8.items()} and len(t1) == 2
    c1, c8 = (json.loads((tmp_path / f"c{b}.json").read_text()) for b in (1, 8))
    assert c1["tensors"].keys() == c8["tensors"].keys() and c1["calibrator"] == "entropy" and c1["samples"] == 16
    assert c1["data_sha256"] == c8["data_sha256"] and c1["kiln"] == kiln.__version__
    # a rebuild from the cache alone needs no data and gives the same engine
    again = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib_cache=str(tmp_path / "c1.json")))
    assert "calibration cache" in again.build_info["int8"]["scales_from"]
    assert np.array_equal(again.run({"x": x[:2]})["y"], engines[0].run({"x": x[:2]})["y"])
    # the Python API takes any iterable of input dicts
    it = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True),
                    calib_data=({"x": x[i:i + 4]} for i in range(0, 16, 4)))
    assert ({n: v["scale"] for n, v in it.build_info["int8"]["tensors"].items()}
            == {n: v["scale"] for n, v in t1.items()})
    # a folder of NAME.npy
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "x.npy", x)
    d = kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "d")))
    assert {n: v["scale"] for n, v in d.build_info["int8"]["tensors"].items()} == {n: v["scale"] for n, v in t1.items()}


def test_calibration_data_errors_are_input_errors(tmp_path):
    path = _model(tmp_path)
    np.savez(tmp_path / "wrong.npz", y=np.zeros((2, 3, 6, 6), np.float32))
    with pytest.raises(InputError, match="lacks arrays for inputs"):
        kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "wrong.npz")))
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a readable .npz"):
        kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib=str(tmp_path / "bad.npz")))


@pytest.mark.parametrize("body, match", [
    ("[]", "not valid JSON"),
    ('{"format": "other", "version": 1}', "not a version-1"),
    ('{"format": "kiln-calibration-cache", "version": 1, "kiln": "0", "calibrator": "bogus", "data_sha256": ""}',
     "bad calibrator"),
    ('{"format": "kiln-calibration-cache", "version": 1, "kiln": "0", "calibrator": "minmax", "data_sha256": "",'
     ' "tensors": {"x": {"scale": -1}}}', "finite positive"),
    ('{"format": "kiln-calibration-cache", "version": 1, "kiln": "0", "calibrator": "minmax", "data_sha256": "",'
     ' "tensors": {"x": {"scale": "0.1"}}}', "finite positive"),
    ('{"format": "kiln-calibration-cache", "version": 1, "kiln": "0", "calibrator": "minmax", "data_sha256": "",'
     ' "tensors": {"x": {"scale": 1e999}}}', "not valid JSON|finite"),
])
def test_bad_cache_files_are_config_errors(tmp_path, body, match):
    p = tmp_path / "c.json"
    p.write_text(body)
    with pytest.raises(ConfigError, match=match):
        calib_cache.read(p)


def test_a_cache_for_another_model_is_refused_without_data(tmp_path):
    path = _model(tmp_path)
    p = tmp_path / "c.json"
    calib_cache.CalibrationCache("entropy", 99.99, "0" * 64, 4, {}).write(p)
    with pytest.raises(ConfigError, match="lacks scales for 2 of 2 tensors"):
        kiln.build(path, kiln.BuildConfig(device="cpu", int8=True, calib_cache=str(p)))
