"""`kiln.compile`: a torch module to a callable that runs kiln engines, one per input signature, built on demand.

The call's arguments are bound to the forward's signature and flattened (torch.utils._pytree) into leaves: tensors
become the engine's inputs (named after their argument: `x`, `mask`, `inputs.ids`), other values (ints, bools, None)
are baked into the exported graph and are part of the cache key. The result's structure (a tensor, tuple, dict,
a transformers ModelOutput) is recorded at export and rebuilt around the engine's outputs.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.utils._pytree as pytree

from kiln.compile.export import to_onnx
from kiln.config import BuildConfig
from kiln.errors import ConfigError, InputError, ModelError
from kiln.runtime import Engine

_BUILD_FIELDS = {f.name for f in fields(BuildConfig)}
_SHAPE_FIELDS = {"profiles", "profile_buckets"}  # come from example_inputs and dynamic=, never from the caller
_BUILD_ARGS = ("calib_data", "validation_data")
QUICK_KEYS = 256  # distinct all-tensor call signatures remembered for the quick path


def build_engine(model, config: BuildConfig, **kw) -> Engine:
    """kiln.build, named here so that tests (and callers) can watch or replace the step that builds engines."""
    return Engine.build(model, config, **kw)


def _key_name(k) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _hashable(v) -> Any:
    try:
        hash(v)
        return v
    except TypeError:
        return ("repr", type(v).__name__, repr(v))


@dataclass
class _Entry:
    """One built engine and how to call it: which flat leaves feed which inputs, how to rebuild the result."""

    engine: Engine
    feeds: list[tuple[int, str]]           # (leaf index, engine input name)
    outputs: list[str]                     # engine output names, in the order of the result's tensor leaves
    out_spec: Any
    out_leaves: list[Any]                  # the result's leaves: None where an engine output goes, else the constant
    context: Any = field(default=None)


class _Flat(torch.nn.Module):
    """`module` called with flat tensors: they fill the tensor leaves of the recorded call, the result is flattened
    (its structure recorded on the side)."""

    def __init__(self, module, sig, spec, leaves: list, inputs: list[int], frozen: list[int]):
        super().__init__()
        self.module = module
        self.sig, self.spec, self.inputs = sig, spec, inputs
        self.template = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        self.frozen = frozen
        for i in frozen:
            self.register_buffer(f"frozen_{i}", leaves[i].detach())
        self.out_spec = self.out_leaves = None

    def forward(self, *flat):
        leaves = list(self.template)
        for i, v in zip(self.inputs, flat):
            leaves[i] = v
        for i in self.frozen:
            leaves[i] = getattr(self, f"frozen_{i}")
        arguments = pytree.tree_unflatten(leaves, self.spec)
        bound = inspect.BoundArguments(self.sig, arguments) if self.sig is not None else None
        out = self.module(*bound.args, **bound.kwargs) if bound is not None else self.module(*arguments)
        out_leaves, self.out_spec = pytree.tree_flatten(out)
        self.out_leaves = [None if isinstance(v, torch.Tensor) else v for v in out_leaves]
        return tuple(v for v in out_leaves if isinstance(v, torch.Tensor))


class CompiledModule:
    """A torch module whose calls run kiln engines (inference only: results carry no autograd history).

    `builds` counts the engines built, `hits` the calls an existing engine served."""

    def __init__(self, module, example_inputs=None, *, fp16: bool = False, bf16: bool = False, int8: bool = False,
                 dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None, device: str = "auto",
                 freeze: Callable[[str, torch.Tensor], bool] | None = None, **build_options):
        if not callable(module):
            raise ConfigError("kiln.compile: module must be a torch.nn.Module or callable, "
                              f"got {type(module).__name__}")
        self.module = module
        # freeze(name, tensor): which tensor arguments are weights, baked into the engine as constants (the dynamo
        # backend's lifted parameters and buffers); the cache key holds their identity and version
        self.freeze = freeze
        unknown = sorted(set(build_options) - _BUILD_FIELDS - set(_BUILD_ARGS))
        if unknown or {"fp16", "bf16", "int8", "device", *_SHAPE_FIELDS} & set(build_options):
            raise ConfigError(f"kiln.compile: unknown build options {unknown or sorted(build_options)}; give "
                              f"BuildConfig fields ({', '.join(sorted(_BUILD_FIELDS - _SHAPE_FIELDS))}) or "
                              f"{', '.join(_BUILD_ARGS)}; shapes come from example_inputs and dynamic=")
        self.build_args = {k: build_options.pop(k) for k in _BUILD_ARGS if k in build_options}
        self.options = dict(fp16=fp16, bf16=bf16, int8=int8, device=device, **build_options)
        BuildConfig(**self.options)  # a bad option fails here, not at the first call
        self.dynamic = self._check_dynamic(dynamic)
        forward = getattr(module, "forward", module)
        try:
            self.sig = inspect.signature(forward)
        except (TypeError, ValueError):
            self.sig = None
        self.engines: dict[Any, _Entry] = {}
        self._quick: dict[Any, tuple] = {}  # quick key → (entry, [(argument position, input name)], param versions)
        self._params: list | None = None
        self.builds = self.hits = 0
        if example_inputs is not None:
            args, kwargs = ((), dict(example_inputs)) if isinstance(example_inputs, Mapping) else \
                (tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,), {})
            self._entry(*self._flatten(args, kwargs))

    @staticmethod
    def _check_dynamic(dynamic) -> dict[str, dict[int, tuple[int, int]]]:
        fix = "write dynamic={'x': {0: (1, 64)}}: input name → {dim: (min, max)}"
        if dynamic is None:
            return {}
        if not isinstance(dynamic, Mapping):
            raise ConfigError(f"kiln.compile: dynamic={dynamic!r} is not a dict; {fix}")
        out = {}
        for name, dims in dynamic.items():
            if not isinstance(dims, Mapping):
                raise ConfigError(f"kiln.compile: dynamic[{name!r}]={dims!r} is not a dict; {fix}")
            out[name] = {}
            for d, r in dims.items():
                if not (isinstance(d, int) and isinstance(r, (tuple, list)) and len(r) == 2
                        and all(isinstance(v, int) for v in r) and 1 <= r[0] <= r[1]):
                    raise ConfigError(f"kiln.compile: dynamic[{name!r}][{d!r}]={r!r} is not a (min, max) range of "
                                      f"ints with 1 <= min <= max; {fix}")
                out[name][d] = tuple(r)
        return out

    # -- calls ------------------------------------------------------------------------------
    def key(self, *args, **kwargs):
        """The cache key of a call with these arguments: calls with equal keys share one engine."""
        return self._flatten(args, kwargs)[0]

    def __call__(self, *args, **kwargs):
        quick = self._quick_key(args, kwargs)
        hit = self._quick.get(quick) if quick is not None else None
        if hit is not None and hit[2] == [t._version for t in self._params]:
            self.hits += 1
            values = (*args, *kwargs.values())
            return self._finish(hit[0], {name: values[j] for j, name in hit[1]})
        key, leaves, spec, names = self._flatten(args, kwargs)
        entry = self._entry(key, leaves, spec, names)
        feeds = {name: leaves[i] for i, name in entry.feeds}
        if quick is not None:
            self._remember(quick, entry, leaves, (*args, *kwargs.values()))
        return self._finish(entry, feeds)

    def _quick_key(self, args, kwargs):
        """A cheap key for calls whose arguments are all tensors (shapes, dtypes, devices, keyword order), or None.
        It skips binding, flattening and walking the parameters, which cost more than a small engine's run."""
        if self.freeze is not None or len(self._quick) > QUICK_KEYS:
            return None
        values = (*args, *kwargs.values())
        if not all(type(v) is torch.Tensor for v in values):
            return None
        return (len(args), tuple(kwargs), getattr(self.module, "training", False),
                tuple((v.dtype, v.device, v.shape) for v in values))

    def _remember(self, quick, entry: _Entry, leaves: list, values: tuple) -> None:
        """Where each engine input sits among the call's arguments, for the quick path (not if one is missing)."""
        where = []
        for i, name in entry.feeds:
            j = next((j for j, v in enumerate(values) if v is leaves[i]), None)
            if j is None:
                return
            where.append((j, name))
        if self._params is None:
            self._params = list(self._state()) if isinstance(self.module, torch.nn.Module) else []
        self._quick[quick] = (entry, where, [t._version for t in self._params])

    def _finish(self, entry: _Entry, feeds: dict):
        """Run the entry's engine on its feeds and rebuild the module's result structure around the outputs."""
        if entry.context is None:
            entry.context = entry.engine.create_context()
        result = entry.context.run(feeds)
        tensors = iter(result[n] for n in entry.outputs)
        home = next(iter(feeds.values())).device if feeds else None
        out = []
        for v in entry.out_leaves:
            if v is None:
                v = next(tensors)
                if isinstance(v, torch.Tensor) and home is not None and v.device != home:
                    v = v.to(home)  # eager's results live where its inputs do
            out.append(v)
        return pytree.tree_unflatten(out, entry.out_spec)

    def _flatten(self, args, kwargs):
        """(cache key, leaves, their spec, input names) of one call."""
        if self.sig is not None:
            try:
                arguments = dict(self.sig.bind(*args, **kwargs).arguments)
            except TypeError as e:
                raise InputError(f"kiln.compile: these arguments do not fit {type(self.module).__name__}.forward"
                                 f"{self.sig}: {e}") from None
        else:
            if kwargs:
                raise InputError("kiln.compile: this callable's signature is unknown; pass positional arguments")
            arguments = list(args)
        flat, spec = pytree.tree_flatten_with_path(arguments)
        leaves = [v for _, v in flat]
        names, seen, key = [], set(), []
        for path, v in flat:
            name = self._name(path)
            while name in seen:
                name += "_"
            seen.add(name)
            names.append(name)
            if not isinstance(v, torch.Tensor):
                key.append(("c", type(v).__name__, _hashable(v)))
            elif self.freeze is not None and self.freeze(name, v):
                key.append(("p", id(v), v._version))
            else:
                key.append(("t", v.dtype, v.device.type, self._shape_key(name, v.shape)))
        unused = set(self.dynamic) - set(names)
        if unused:
            raise ConfigError(f"kiln.compile: dynamic names {sorted(unused)}, which are not tensor inputs of this "
                              f"call; its inputs are {names}")
        params = tuple((id(t), t._version) for t in self._state()) if isinstance(self.module, torch.nn.Module) else ()
        training = getattr(self.module, "training", False)
        return (_hashable(spec), tuple(key), params, training), leaves, spec, names

    def _name(self, path) -> str:
        keys = [_key_name(k) for k in path]
        if self.sig is not None and keys:
            p = self.sig.parameters.get(keys[0])
            if p is not None and p.kind == p.VAR_KEYWORD and len(keys) > 1:
                keys = keys[1:]
        elif keys:
            keys[0] = f"input_{keys[0]}"
        return re.sub(r"[^A-Za-z0-9_.]", "_", ".".join(keys)) or "input"

    def _state(self):
        yield from self.module.parameters()
        yield from self.module.buffers()

    def _shape_key(self, name: str, shape) -> tuple:
        dims = self.dynamic.get(name, {})
        out = list(shape)
        for d, (lo, hi) in dims.items():
            if not -len(shape) <= d < len(shape):
                raise ConfigError(f"kiln.compile: dynamic[{name!r}] names dim {d}, but {name!r} has rank {len(shape)}")
            if not lo <= shape[d] <= hi:
                raise InputError(f"kiln.compile: input {name!r} has size {shape[d]} in dim {d}, outside the dynamic "
                                 f"range {lo}..{hi} it was compiled for; widen dynamic={{{name!r}: {{{d}: ...}}}}")
            out[d] = -1
        return tuple(out)

    # -- building ---------------------------------------------------------------------------
    def _entry(self, key, leaves, spec, names) -> _Entry:
        entry = self.engines.get(key)
        if entry is not None:
            self.hits += 1
            return entry
        entry = self.engines[key] = self._build(leaves, spec, names)
        self.builds += 1
        return entry

    def _build(self, leaves, spec, names) -> _Entry:
        frozen = [i for i, v in enumerate(leaves)
                  if isinstance(v, torch.Tensor) and self.freeze is not None and self.freeze(names[i], v)]
        inputs = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and i not in frozen]
        flat = _Flat(self.module, self.sig, spec, leaves, inputs, frozen)
        args = tuple(leaves[i] for i in inputs)
        input_names = [names[i] for i in inputs]
        dynamic = {j: self.dynamic[names[i]] for j, i in enumerate(inputs) if names[i] in self.dynamic}
        what = type(self.module).__name__
        model = to_onnx(flat, args, input_names, None, dynamic, what)
        if flat.out_spec is None:  # an exporter that did not run the Python forward
            with torch.no_grad():
                flat(*args)
        outputs = [o.name for o in model.graph.output]
        if len(outputs) != sum(v is None for v in flat.out_leaves):
            raise ModelError(f"kiln.compile: the ONNX export of {what} has {len(outputs)} outputs, its forward "
                             f"returns {sum(v is None for v in flat.out_leaves)} tensors")
        config = BuildConfig(profiles=(self._profile(model, leaves, inputs, names),) if inputs else (),
                             **self.options)
        engine = build_engine(model, config, **self.build_args)
        known = set(engine.network.inputs)
        feeds = [(i, names[i]) for i in inputs if names[i] in known]
        return _Entry(engine, feeds, outputs, flat.out_spec, list(flat.out_leaves))

    def _profile(self, model, leaves, inputs, names) -> dict:
        graph_inputs = {i.name for i in model.graph.input}
        profile = {}
        for i in inputs:
            if names[i] not in graph_inputs:
                continue
            shape = tuple(leaves[i].shape)
            lo, hi = list(shape), list(shape)
            for d, (a, b) in self.dynamic.get(names[i], {}).items():
                lo[d], hi[d] = a, b
            profile[names[i]] = (tuple(lo), shape, tuple(hi))
        return profile

    def __repr__(self) -> str:
        return f"kiln.compile({type(self.module).__name__}, {len(self.engines)} engine(s), options={self.options})"


def compile(module, example_inputs=None, *, fp16: bool = False, bf16: bool = False, int8: bool = False,
            dynamic: Mapping[str, Mapping[int, tuple[int, int]]] | None = None, device: str = "auto",
            **build_options) -> CompiledModule:
    """`module` (a torch.nn.Module) as a callable that runs kiln engines: call it as you call the module, get the
    same structure back (a tensor, tuple or dict of tensors). `example_inputs`: a tensor, a tuple of positional
    arguments or a dict of keyword arguments; the engine for them is built now, others when first called (one per
    input signature: shapes, dtypes, non-tensor argument values; parameters changed in place rebuild too, a
    parameter object replaced by another is not watched: compile again).
    `dynamic={"x": {0: (1, 64)}}` lets those dims vary within [min, max] (opt: the example's size) in one engine.
    `build_options`: other kiln.BuildConfig fields (opt_level, timing_cache, ...), calib_data, validation_data.
    Export errors are kiln.ModelError; kiln's own import/build errors pass through."""
    return CompiledModule(module, example_inputs, fp16=fp16, bf16=bf16, int8=int8, dynamic=dynamic, device=device,
                          **build_options)
