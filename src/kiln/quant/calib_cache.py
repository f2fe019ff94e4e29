"""The calibration cache: a JSON file of tensor → scale (and observed range), so a rebuild needs no data.

    {"format": "kiln-calibration-cache", "version": 1, "kiln": "0.1.0", "calibrator": "entropy",
     "percentile": 99.99, "data_sha256": "…", "samples": 64,
     "tensors": {"input": {"scale": 0.0213, "min": -2.4, "max": 2.7}, …}}

Written under kiln's write policy (kiln.util.files: atomic, no links); read as untrusted input.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from kiln.util.safe_json import load_json
from kiln.errors import ConfigError
from kiln.quant import calibrators
from kiln.quant.scheme import TensorScale
from kiln.util import files
from kiln.version import __version__

FORMAT, VERSION = "kiln-calibration-cache", 1
KIND = files.json_kind("calibration cache", "calib.json", FORMAT, key="format")
MAX_BYTES, MAX_TENSORS, MAX_NAME = 16 << 20, 100_000, 4096
FIX = "delete it, or rebuild it with --calib DATA"


@dataclass
class CalibrationCache:
    calibrator: str
    percentile: float
    data_sha256: str
    samples: int
    scales: dict[str, TensorScale]
    kiln: str = __version__

    def write(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        body = {"format": FORMAT, "version": VERSION, "kiln": self.kiln, "calibrator": self.calibrator,
                "percentile": self.percentile, "data_sha256": self.data_sha256, "samples": self.samples,
                "tensors": {n: {"scale": s.scale, "min": (s.range or (0.0, 0.0))[0], "max": (s.range or (0.0, 0.0))[1]}
                            for n, s in sorted(self.scales.items())}}
        return files.write(path, json.dumps(body, indent=1).encode(), KIND, what="calibration cache")


def _number(v, what: str, path, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise ConfigError(f"calibration cache {path}: {what} must be a finite{' positive' if positive else ''} "
                          f"number, got {str(v)[:40]!r}; {FIX}")
    return float(v)


def read(path: str | os.PathLike) -> CalibrationCache:
    """The cache at `path`, every field checked; ConfigError naming the fix on any problem."""
    d = load_json(path, max_bytes=MAX_BYTES, what="calibration cache", error=ConfigError, fix=FIX)
    if d.get("format") != FORMAT or d.get("version") != VERSION:
        raise ConfigError(f"calibration cache {path} is not a version-{VERSION} kiln calibration cache; {FIX}")
    cal, sha, kiln = d.get("calibrator"), d.get("data_sha256"), d.get("kiln")
    if cal not in calibrators.CALIBRATORS or not isinstance(sha, str) or len(sha) > 128 \
            or not isinstance(kiln, str) or len(kiln) > 64:
        raise ConfigError(f"calibration cache {path} has a bad calibrator, data_sha256 or kiln field; {FIX}")
    samples = d.get("samples", 0)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ConfigError(f"calibration cache {path}: samples must be a count; {FIX}")
    tensors = d.get("tensors")
    if not isinstance(tensors, dict) or len(tensors) > MAX_TENSORS:
        raise ConfigError(f"calibration cache {path}: tensors must be an object of at most {MAX_TENSORS} "
                          f"entries; {FIX}")
    scales = {}
    for name, e in tensors.items():
        if len(name) > MAX_NAME or not isinstance(e, dict):
            raise ConfigError(f"calibration cache {path}: entry {name[:60]!r} is not a tensor record; {FIX}")
        scale = _number(e.get("scale"), f"the scale of {name[:60]!r}", path, positive=True)
        lo = _number(e.get("min", 0.0), f"the min of {name[:60]!r}", path)
        hi = _number(e.get("max", 0.0), f"the max of {name[:60]!r}", path)
        scales[name] = TensorScale(scale, f"cache ({cal})", (lo, hi))
    return CalibrationCache(cal, _number(d.get("percentile", calibrators.DEFAULT_PERCENTILE), "percentile", path),
                            sha, samples, scales, kiln)
