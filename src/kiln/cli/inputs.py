"""Engines and tensors for `run` and `bench`: open a plan (or build an .onnx), load or make inputs, save outputs.

numpy, torch and the runtime are imported inside the functions: importing the CLI (`kiln --help`) stays light."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import typer

import kiln
from kiln.cli.errors import one_line
from kiln.cli.options import is_onnx
from kiln.cli.output import build_progress
from kiln.errors import ConfigError, InputError
from kiln.util import files

if TYPE_CHECKING:
    import numpy as np

NPY = files.magic_kind(".npy array", "output.npy", b"\x93NUMPY")


def load_plan(path: Path, policy: str = "strict", verify_key: Path | None = None, **kw) -> kiln.Engine:
    """`kiln.load` with each compatibility warning printed as one `warning: ...` line on stderr."""
    from kiln.engine.compat import CompatibilityWarning

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
                verify_key: Path | None = None, config: kiln.BuildConfig | None = None) -> kiln.Engine:
    """Load a plan, or build an .onnx model with `shapes` fixed (or with `config`, the build flags), showing build
    progress (the plan is not saved)."""
    if not is_onnx(path):
        return load_plan(path, policy, verify_key)
    with build_progress(f"building {path.name}") as progress:
        return kiln.build(path, config or kiln.BuildConfig.with_shapes(shapes, device=device), progress)


def warn_default_shape(name: str, shape_str: str, shape: tuple[int, ...], source: str) -> None:
    """trtexec's one line for a dynamic input run without --shapes."""
    dims = "x".join(map(str, shape))
    typer.echo(f"warning: input {name!r} has dynamic shape {shape_str} and no --shapes or --input; using {dims} "
               f"({source}); choose with --shapes {name}:{dims}", err=True)


def input_shapes(engine: kiln.Engine, shapes: dict[str, tuple[int, ...]], default_dynamic: bool = False
                 ) -> dict[str, tuple[int, ...]]:
    """The shape of each input: from --shapes, else the first profile's opt shape, else the engine's static shape.
    With `default_dynamic` (bench, profile: as trtexec does) a dynamic input none of these give runs at the
    profile's opt shape or with each dynamic dimension 1, saying so in one warning line; without, that is an error."""
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
            if default_dynamic and not t.is_static:
                warn_default_shape(t.name, t.shape_str(), out[t.name], "the profile's opt shape")
        elif t.is_static:
            out[t.name] = t.shape
        elif default_dynamic:
            out[t.name] = tuple(d if isinstance(d, int) else 1 for d in t.shape)
            warn_default_shape(t.name, t.shape_str(), out[t.name], "each dynamic dimension 1")
        else:
            example = "x".join(str(d) if isinstance(d, int) else "1" for d in t.shape or (1,))
            raise ConfigError(f"input {t.name!r} has dynamic shape {t.shape_str()}; give its size with "
                              f"--shapes {t.name}:{example}")
    return out


def random_feeds(engine: kiln.Engine, shapes: dict[str, tuple[int, ...]], seed: int, default_dynamic: bool = False,
                 skip: set[str] | frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """Random numpy inputs: normal floats, random booleans, integers in [0, 4) (valid for every integer type and
    as small indices; as text for string inputs), or in [0, rows) for indices into a table of `rows` (embeddings).
    Inputs in `skip` (given as files) get none."""
    import numpy as np

    from kiln.ir import DType
    from kiln.runtime.io import index_bounds

    rng = np.random.default_rng(seed)
    bounds = index_bounds(engine.network)
    feeds = {}
    for name, shape in input_shapes(engine, shapes, default_dynamic).items():
        if name in skip:
            continue
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
    import torch

    from kiln.ir.dtype import to_torch

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
    from kiln.ir import DType

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
    from kiln.util.npyio import read_npy, read_npz

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
    import numpy as np

    for name, value in outputs.items():
        value = value.astype(str) if value.dtype == object else value
        files.write(paths[name], lambda f, v=value: np.save(f, v, allow_pickle=False), NPY, force=force,
                    what="output file")
    return {name: paths[name] for name in outputs}


def onnx_build_shapes(model: Path, shapes: dict[str, tuple[int, ...]], batch: int | None,
                      ranged: set[str] | frozenset[str] = frozenset()) -> dict[str, tuple[int, ...]]:
    """What `bench` / `profile` build an .onnx with: `shapes` (--shapes, --input arrays), and for each other input
    not in `ranged` (--profile, --min/--max-shapes) its declared dimensions, the leading one --batch, any other
    dynamic one 1 with a warning (as trtexec does)."""
    from kiln.errors import ModelError
    from kiln.frontend.onnx.loader import read_model

    if not model.is_file():
        raise ModelError(f"model file {model} does not exist; give the path of an .onnx file or a plan")
    graph = read_model(model).graph
    initializers = {t.name for t in graph.initializer}
    out = dict(shapes)
    for vi in graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in initializers or vi.name in out or vi.name in ranged or not dims:
            continue
        declared = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if batch is not None:
            if declared[0] is not None and declared[0] != batch:
                raise ConfigError(f"--batch {batch}: input {vi.name!r} of {model.name} has a fixed leading "
                                  f"dimension {declared[0]}; export the model with a dynamic batch dimension, or drop "
                                  "--batch")
            declared[0] = batch
        out[vi.name] = tuple(1 if d is None else d for d in declared)
        if None in declared:
            shape_str = "[" + ",".join(d.dim_param or "?" if not d.HasField("dim_value") else str(d.dim_value)
                                       for d in dims) + "]"
            warn_default_shape(vi.name, shape_str, out[vi.name], "each dynamic dimension 1")
    return out


def batch_shapes(engine: kiln.Engine, shapes: dict[str, tuple[int, ...]], batch: int | None
                 ) -> dict[str, tuple[int, ...]]:
    """Each input's shape (a dynamic one without --shapes defaulted, with a warning), with the leading dimension of
    those `shapes` does not give set to --batch."""
    resolved = input_shapes(engine, shapes, default_dynamic=batch is None)
    if batch is None:
        return resolved
    for t in engine.inputs:
        shape = resolved[t.name]
        if t.name in shapes or not shape:
            continue
        fixed = t.shape[0] if t.shape else None
        if isinstance(fixed, int) and fixed != batch:
            raise ConfigError(f"--batch {batch}: input {t.name!r} has fixed shape {t.shape_str()}; rebuild the "
                              f"model with a dynamic batch dimension (--min-shapes/--max-shapes), or drop --batch")
        resolved[t.name] = (batch, *shape[1:])
    return resolved


def engine_and_feeds(model: Path, specs: list[str] | None, shapes: dict[str, tuple[int, ...]], batch: int | None,
                     device: str, policy: str, verify_key: Path | None, seed: int, flags: dict,
                     cuda_graph: bool = True) -> tuple[kiln.Engine, dict[str, np.ndarray], dict[str, tuple]]:
    """`bench` and `profile`: the engine (a plan, or an .onnx built with the build `flags`, whose shapes --input
    arrays and --shapes fix) and its host inputs, from --input files where given, random (seeded) for the rest;
    and each input's shape."""
    from kiln.cli.build import build_config, build_flags_given
    from kiln.cli.options import parse_shapes

    loaded = load_inputs(specs) if specs and is_onnx(model) else {}
    if is_onnx(model):
        given = _array_shapes(loaded, shapes)
        ranged = set(parse_shapes(flags.get("min_shapes"), "--min-shapes"))
        ranged |= {n for spec in flags.get("profile") or () for n in parse_shapes(list(spec)[:1], "--profile")}
        build_shapes = onnx_build_shapes(model, {n: s for n, s in given.items() if n not in ranged}, batch, ranged)
        config = build_config(build_shapes, device, cuda_graph, **flags)
        engine = open_engine(model, build_shapes, device, config=config)
    else:
        set_flags = build_flags_given(flags)
        if set_flags:
            raise ConfigError(f"{', '.join(set_flags)} apply when building an .onnx model; {model} is a plan, built "
                              "already: drop them, or give the .onnx model")
        engine = load_plan(model, policy, verify_key)
        loaded = load_inputs(specs, engine) if specs else {}
        given = _array_shapes(loaded, shapes)
    names = [t.name for t in engine.inputs]
    unknown = sorted(set(loaded) - set(names))
    if unknown:
        raise ConfigError(f"--input names {unknown}, but the engine's inputs are {names}")
    resolved = batch_shapes(engine, given, batch)
    feeds = random_feeds(engine, resolved, seed, skip=set(loaded))
    feeds = {n: loaded[n] if n in loaded else feeds[n] for n in names}
    if loaded:  # wrong dtypes or shapes: one clear error now, not from inside the timing loop
        engine.create_context().run(feeds)
    return engine, feeds, resolved


def _array_shapes(loaded: dict, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """--shapes plus each --input array's shape; an input given both ways must agree."""
    out = dict(shapes)
    for name, value in loaded.items():
        if name in shapes and tuple(shapes[name]) != tuple(value.shape):
            raise ConfigError(f"--shapes gives {name!r} as {'x'.join(map(str, shapes[name]))} but its --input array "
                              f"is {'x'.join(map(str, value.shape))}; drop one of them")
        out[name] = tuple(value.shape)
    return out
