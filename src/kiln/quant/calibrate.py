"""Calibration: run the float network over user data once, collecting each observed tensor's statistics.

Data: a `.npz` file or a folder of `NAME.npy` files (one array per network input, samples along axis 0,
read without pickle and fed `batch` samples at a time), a single `.npy` for a one-input network, or
(Python API) any iterable of {input name: array} dicts. The scales do not depend on the batch size
(histogram.py); batches are re-batched to a network built for a fixed batch (batching.py);
`data_sha256` identifies the data in the calibration cache.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from kiln.errors import InputError
from kiln.ir import Network
from kiln.kinds.interpret import run_layers, to_device
from kiln.util.npyio import read_npy, read_npz
from kiln.quant import calibrators
from kiln.quant.batching import fitted
from kiln.quant.histogram import Histogram
from kiln.quant.scheme import TensorScale, scale_from_amax

MAX_FILES = 1024


@dataclass
class CalibrationData:
    """Batches of network inputs and a hash of what they hold."""

    batches: Iterable[dict[str, Any]]
    samples: int = 0
    description: str = ""
    streams: dict[str, Any] = field(default_factory=dict)   # input → (dtype, sample shape, sha256 of its bytes)

    def add(self, feeds: dict[str, torch.Tensor]) -> None:
        """Hash a batch so that the digest depends on the samples, not on how they were batched."""
        for name, t in feeds.items():
            head = (str(t.dtype), list(t.shape[1:]))
            kind, _, h = self.streams.setdefault(name, (*head, hashlib.sha256()))
            if (kind, _) != head:
                raise InputError(f"calibration input {name!r} changes dtype or sample shape between batches "
                                 f"({kind}{_} then {head[0]}{head[1]}); give one dtype and sample shape per input")
            h.update(t.detach().cpu().contiguous().numpy().tobytes())

    def sha256(self) -> str:
        return hashlib.sha256(repr(sorted((n, d, s, h.hexdigest()) for n, (d, s, h) in self.streams.items()))
                              .encode()).hexdigest()


def _arrays(path: Path, inputs: list[str]) -> dict[str, np.ndarray]:
    """Input name → all samples, from a .npz, a folder of NAME.npy, or one .npy for a one-input network."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".npy")[:MAX_FILES + 1]
        if len(files) > MAX_FILES:
            raise InputError(f"calibration folder {path} holds more than {MAX_FILES} .npy files; "
                             "give one NAME.npy per network input")
        arrays = {p.stem: read_npy(p, mmap=True) for p in files}
    elif path.suffix == ".npz" and path.is_file():
        arrays = read_npz(path, names=inputs)
    elif path.suffix == ".npy" and path.is_file() and len(inputs) == 1:
        arrays = {inputs[0]: read_npy(path, mmap=True)}
    else:
        raise InputError(f"calibration data {path} is not a .npz file, a folder of NAME.npy files, or (for a "
                         "one-input network) a .npy file; give one of those to --calib")
    missing = [n for n in inputs if n not in arrays]
    if missing:
        raise InputError(f"calibration data {path} lacks arrays for inputs {missing}; it has {sorted(arrays)[:10]}. "
                         "Name each array after a network input")
    arrays = {n: arrays[n] for n in inputs}
    sizes = {n: (a.shape[0] if a.ndim else 0) for n, a in arrays.items()}
    if len(set(sizes.values())) != 1 or 0 in sizes.values():
        raise InputError(f"calibration arrays must hold the same number (> 0) of samples along axis 0; got {sizes}")
    for n, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise InputError(f"calibration array {n!r} has dtype {a.dtype}; give numbers")
    return arrays


def calibration_data(source: Any, inputs: list[str], batch: int = 16) -> CalibrationData:
    """`source` (a path, or an iterable of input dicts) as CalibrationData."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        arrays = _arrays(path, inputs)
        n = next(iter(arrays.values())).shape[0]
        data = CalibrationData([], description=f"{n} samples from {path.name}")
        data.batches = ({k: np.ascontiguousarray(a[i:i + batch]) for k, a in arrays.items()}
                        for i in range(0, n, batch))
        return data
    if isinstance(source, dict) or not hasattr(source, "__iter__"):
        raise InputError("calibration data must be a path or an iterable of {input name: array} dicts")
    return CalibrationData(source, description="data from the Python API")


def batch_feeds(net: Network, batch: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """One calibration batch as the network\'s input tensors on `device`, checked against its inputs."""
    if not isinstance(batch, dict) or set(batch) < set(net.inputs):
        raise InputError(f"a calibration batch must be a dict with an array for each input {net.inputs}")
    feeds = {}
    for name in net.inputs:
        v = batch[name]
        t = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.require(v, requirements=["C", "W"]))
        want = net.tensors[name].dtype.torch
        if t.is_floating_point() != want.is_floating_point:
            raise InputError(f"calibration input {name!r} is {t.dtype}; the network reads {want}")
        feeds[name] = t.to(device=device, dtype=want)
    return feeds


def collect(net: Network, data: CalibrationData, observe: set[str], device: torch.device,
            extra: dict[str, Any] | None = None) -> dict[str, Histogram]:
    """Statistics of each tensor in `observe` over all of `data`, in one pass of the float network; `extra`: more
    statistics objects (anything with `add(tensor)`, e.g. smooth.ChannelAmax) by tensor name, filled in place."""
    stats = {name: Histogram() for name in observe}
    more = list((extra or {}).items())
    consts = {k: to_device(v, device) for k, v in net.constants.items()}

    def fail(layer, e):
        return InputError(f"calibration failed in layer {layer.name!r} ({layer.kind}): {str(e).splitlines()[0]}; "
                          "check that the calibration data have the shapes and dtypes the model expects")

    def given():
        for batch in data.batches:
            feeds = batch_feeds(net, batch, device)
            data.add(feeds)  # hashed and counted as given, before re-batching
            data.samples += next(iter(feeds.values())).shape[0] if feeds and next(iter(feeds.values())).dim() else 1
            yield feeds

    for feeds in fitted(net, given()):
        values = dict(consts) | feeds
        with torch.inference_mode():
            run_layers(net, values, fail)
        for name, h in list(stats.items()) + more:
            h.add(values[name])
    if data.samples == 0:
        raise InputError("the calibration data hold no samples; give at least one batch")
    return stats


def scales_from(stats: dict[str, Histogram], calibrator: str, percentile: float) -> dict[str, TensorScale]:
    """Each tensor's scale by `calibrator`, with its observed range."""
    cal = calibrators.get(calibrator)
    out = {}
    for name, h in stats.items():
        if h.nonfinite:
            raise InputError(f"tensor {name!r} held {h.nonfinite} NaN/inf values during calibration; "
                            "check the calibration data (or the model) for them")
        out[name] = TensorScale(scale_from_amax(cal.amax(h, percentile)), f"calibrated ({calibrator})",
                                (h.lo, h.hi) if h.lo <= h.hi else (0.0, 0.0))
    return out

