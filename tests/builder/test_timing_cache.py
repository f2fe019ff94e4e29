"""The sqlite timing cache: round trip, keys separate devices and versions, damaged files are refused."""

import pytest

from kiln.builder.timing_cache import CachedChoice, TimingCache, environment_key
from kiln.errors import ConfigError


def test_round_trip_and_keys(tmp_path):
    cache = TimingCache(tmp_path / "t.db")
    h100 = environment_key({"name": "H100", "cc": "9.0", "torch": "2.11", "kiln": "0.1.0"})
    t4 = environment_key({"name": "T4", "cc": "7.5", "torch": "2.11", "kiln": "0.1.0"})
    cache.put(h100, "sig1", CachedChoice("cudnn_conv", {"layout": "nhwc"}, 12.5))
    assert cache.get(h100, "sig1") == CachedChoice("cudnn_conv", {"layout": "nhwc"}, 12.5)
    assert cache.get(t4, "sig1") is None and cache.get(h100, "sig2") is None
    again = TimingCache(tmp_path / "t.db")  # persistent, shared across builds
    assert again.get(h100, "sig1").config == {"layout": "nhwc"} and len(again) == 1
    assert (cache.hits, cache.misses) == (1, 2)


def test_damaged_and_unsafe_paths_are_refused(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ConfigError, match="not a kiln timing cache"):
        TimingCache(bad)
    (tmp_path / "link.db").symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(ConfigError, match="regular file"):
        TimingCache(tmp_path / "link.db")
    with pytest.raises(ConfigError, match="does not exist"):
        TimingCache(tmp_path / "no" / "t.db")
