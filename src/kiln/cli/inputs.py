"""Engines and tensors for `run` and `bench`: open a plan (or build an .onnx), load or make inputs, save outputs."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import numpy as np
import torch
import typer

import kiln
from kiln.cli.errors import one_line
from kiln.cli.options import is_onnx
from kiln.cli.output import build_progress
from kiln.engine.compat import CompatibilityWarning
from kiln.errors import ConfigError, InputError
from kiln.ir import DType
from kiln.ir.dtype import to_torch
from kiln.util.npyio import read_npy, read_npz
from kiln.runtime.io import index_bounds
from kiln.util import files

NPY = files.magic_kind(".npy array", "output.npy", b"\x93NUMPY")


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
    as small indices; as text for string inputs), or in [0, rows) for indices into a table of `rows` (embeddings)."""
    rng = np.random.default_rng(seed)
    bounds = index_bounds(engine.network)
    feeds = {}
    for name, shape in input_shapes(engine, shapes).items():
        dtype = engine.network.tensors[name].dtype
        if dtype.is_float:
            value = rng.standard_normal(shape)
        elif dtype is DType.BOOL:
            value = rng.random(shape) < 0.5
        else:
            value = rng.integers(0, max(1, bounds[name][0]) if name in bounds else 4, shape)
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


def input_budget(engine: kiln.Engine) -> int | None:
    """The most bytes the engine's inputs take (static shapes, else the profiles' max), counting 8 bytes an element
    at least so that float64 data still reaches the dtype check; None where unbounded."""
    total = 0
    for t in engine.inputs:
        maxes = [math.prod(p[t.name].max) for p in engine.config.profiles if t.name in p]
        if getattr(t, "kind", "tensor") != "tensor" or t.dtype is DType.STRING or not (t.is_static or maxes):
            return None
        total += (math.prod(t.shape) if t.is_static else max(maxes)) * max(t.dtype.itemsize, 8)
    return total


def load_inputs(specs: list[str], engine: kiln.Engine | None = None) -> dict[str, np.ndarray]:
    """`--input name=file.npy` (one input) or `--input file.npz` (every input inside); never unpickles.

    Headers, an archive's member names and the sizes `engine` takes are checked before any data is read."""
    names = engine.network.inputs if engine is not None else None
    budget = input_budget(engine) if engine is not None else None
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if sep and name:
            if file.lower().endswith(".npz"):
                raise InputError(f"{file} is an .npz archive; pass it as --input {file} to feed its arrays by name")
            arrays = {name: read_npy(Path(file), budget)}
        elif spec.lower().endswith(".npz"):
            arrays = read_npz(Path(spec), budget, names=names, others_ok=names is None)
        else:
            raise ConfigError(f"--input {spec!r}: write name=file.npy for one input, or file.npz for all of them")
        twice = sorted(set(arrays) & set(feeds))
        if twice:
            raise ConfigError(f"--input gives {twice} more than once")
        feeds.update(arrays)
    return feeds


def safe_stem(name: str) -> str:
    """A tensor name as a file name that stays inside its folder: [A-Za-z0-9._-] only, no leading dot."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:200] or "output"


def output_paths(names: list[str], folder: Path, force: bool = False) -> dict[str, Path]:
    """One NAME.npy per output in `folder` (created if missing), names sanitized and made unique, each checked
    against kiln's write policy before anything runs."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--output-dir {folder} is not a folder; name a folder (it is created if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create --output-dir {folder}: {e.strerror}; name a folder you can write to") \
            from None
    used: set[str] = set()
    paths = {}
    for name in names:
        stem, k = safe_stem(name), 1
        while stem.lower() in used:
            stem, k = f"{safe_stem(name)}_{k}", k + 1
        used.add(stem.lower())
        paths[name] = files.check(folder / f"{stem}.npy", NPY, force=force, what="output file")
    return paths


def save_outputs(outputs: dict[str, np.ndarray], paths: dict[str, Path], force: bool = False) -> dict[str, Path]:
    """Write each output to its path from `output_paths` as .npy (never pickled)."""
    for name, value in outputs.items():
        value = value.astype(str) if value.dtype == object else value
        files.write(paths[name], lambda f, v=value: np.save(f, v, allow_pickle=False), NPY, force=force,
                    what="output file")
    return {name: paths[name] for name in outputs}
