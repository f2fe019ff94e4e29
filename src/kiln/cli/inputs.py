"""Engines and tensors for `run` and `bench`: open a plan (or build an .onnx), load or make inputs, save outputs."""

from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
import typer

import kiln
from kiln.cli.errors import one_line
from kiln.cli.options import is_onnx
from kiln.cli.output import build_progress
from kiln.engine.compat import CompatibilityWarning
from kiln.errors import ConfigError, InputError, SecurityError
from kiln.ir import DType
from kiln.ir.dtype import to_torch


def load_plan(path: Path, policy: str = "strict", verify_key: Path | None = None, **kw) -> kiln.Engine:
    """`kiln.load` with each compatibility warning printed as one `warning: ...` line on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CompatibilityWarning)
        engine = kiln.Engine.load(path, policy, verify_key=verify_key, **kw)
    for w in caught:
        if issubclass(w.category, CompatibilityWarning):
            typer.echo(f"warning: {one_line(w.message)}", err=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return engine


def open_engine(path: Path, shapes: dict[str, tuple[int, ...]], device: str, policy: str = "strict",
                verify_key: Path | None = None) -> kiln.Engine:
    """Load a plan, or build an .onnx model with `shapes` fixed, showing build progress (the plan is not saved)."""
    if not is_onnx(path):
        return load_plan(path, policy, verify_key)
    with build_progress(f"building {path.name}") as progress:
        return kiln.build(path, kiln.BuildConfig.with_shapes(shapes, device=device), progress)


def input_shapes(engine: kiln.Engine, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The shape of each input: from --shapes, else the first profile's opt shape, else the engine's static shape."""
    names = [t.name for t in engine.inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ConfigError(f"--shapes names {unknown}, but the engine's inputs are {names}")
    profile = engine.config.profiles[0] if engine.config.profiles else {}
    out = {}
    for t in engine.inputs:
        if t.name in shapes:
            out[t.name] = shapes[t.name]
        elif t.name in profile:
            out[t.name] = profile[t.name].opt
        elif t.is_static:
            out[t.name] = t.shape
        else:
            example = "x".join(str(d) if isinstance(d, int) else "1" for d in t.shape or (1,))
            raise ConfigError(f"input {t.name!r} has dynamic shape {t.shape_str()}; give its size with "
                              f"--shapes {t.name}:{example}")
    return out


def random_feeds(engine: kiln.Engine, shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Random numpy inputs: normal floats, random booleans, integers in [0, 4) (valid for every integer type and
    as indices; as text for string inputs)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in input_shapes(engine, shapes).items():
        dtype = engine.network.tensors[name].dtype
        if dtype.is_float:
            value = rng.standard_normal(shape)
        elif dtype is DType.BOOL:
            value = rng.random(shape) < 0.5
        else:
            value = rng.integers(0, 4, shape)
            if dtype.numpy.kind == "O":
                value = value.astype(str)
        feeds[name] = value.astype(dtype.numpy)
    return feeds


def on_device(feeds: dict[str, np.ndarray], device: str) -> dict:
    """numpy inputs as torch tensors on `device` (string arrays stay numpy: they have no torch form)."""
    out = {}
    for name, value in feeds.items():
        t = to_torch(value)
        out[name] = t.to(device) if isinstance(t, torch.Tensor) else t
    return out


def batch_size(feeds: dict) -> int:
    """The first input's leading dimension (1 for a scalar input): what items/s counts."""
    first = next(iter(feeds.values()), None)
    return int(first.shape[0]) if first is not None and len(first.shape) else 1


def load_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    """`--input name=file.npy` (one input) or `--input file.npz` (every input inside); never unpickles."""
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if sep and name:
            value = _load(Path(file))
            if isinstance(value, dict):
                raise InputError(f"{file} is an .npz archive; pass it as --input {file} to feed its arrays by name")
            arrays = {name: value}
        elif spec.lower().endswith(".npz"):
            arrays = _load(Path(spec))
            if not isinstance(arrays, dict):
                raise InputError(f"{spec} holds a single array; pass it as --input NAME={spec}")
        else:
            raise ConfigError(f"--input {spec!r}: write name=file.npy for one input, or file.npz for all of them")
        twice = sorted(set(arrays) & set(feeds))
        if twice:
            raise ConfigError(f"--input gives {twice} more than once")
        feeds.update(arrays)
    return feeds


def _load(path: Path) -> np.ndarray | dict[str, np.ndarray]:
    """One array from a .npy file, or a dict of them from an .npz archive."""
    if not path.is_file():
        raise InputError(f"input file {path} does not exist")
    try:
        value = np.load(path, allow_pickle=False)
        if isinstance(value, np.ndarray):
            return value
        with value:
            return {k: value[k] for k in value.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path} is not a readable .npy/.npz file ({one_line(e)}); save it with numpy.save "
                         "or numpy.savez") from None


def safe_stem(name: str) -> str:
    """A tensor name as a file name that stays inside its folder: [A-Za-z0-9._-] only, no leading dot."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:200] or "output"


def save_outputs(outputs: dict[str, np.ndarray], folder: Path) -> dict[str, Path]:
    """Write one .npy per output into `folder` (created if missing); names are sanitized and made unique."""
    folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    written = {}
    for name, value in outputs.items():
        stem, k = safe_stem(name), 1
        while stem.lower() in used:
            stem, k = f"{safe_stem(name)}_{k}", k + 1
        used.add(stem.lower())
        path = folder / f"{stem}.npy"
        if path.is_symlink():
            raise SecurityError(f"{path} is a symbolic link; kiln does not write through links, remove it first")
        np.save(path, value.astype(str) if value.dtype == object else value, allow_pickle=False)
        written[name] = path
    return written
