"""The `torch.compile(m, backend="kiln")` backend: each graph dynamo captures (one per partition between graph
breaks) runs as kiln engines, built on the first call; a graph kiln cannot export, import or build runs as torch's
own GraphModule, with a KilnFallbackWarning saying why.

A static graph (dynamo's first capture) gets one engine per input signature. When dynamo recompiles a graph with
symbolic sizes (its "automatic dynamic": the second distinct size of a dimension marks it dynamic), the graph gets
ONE dynamic engine, exported with those dimensions dynamic, whose profile is, for each symbolic size:

- min: 1 (dynamo specializes sizes 0 and 1 into graphs of their own, but 1 costs nothing to allow), or the
  ShapeEnv's lower bound where that is above 2 (a `torch._dynamo.mark_dynamic(x, 0, min=...)` constraint);
- opt: the size of the call that builds it (dynamo's example);
- max: `max(DYNAMIC_MAX, DYNAMIC_FACTOR × opt)`, or the ShapeEnv's upper bound where that is finite (a
  `mark_dynamic(max=...)`, or a guard dynamo traced: torch's convolutions guard batch < 16, say; dynamo captures
  another graph for sizes past it).

A later call with a size outside the profile rebuilds the engine once with the range widened to cover it
(to twice that size), replacing the old one.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import torch

from kiln.compile.module import CompiledModule
from kiln.errors import ConfigError

DYNAMIC_MAX = 64     # the smallest max of a symbolic size's profile range
DYNAMIC_FACTOR = 8   # ... which is at least this many times the example's size


class KilnFallbackWarning(UserWarning):
    """A graph runs in torch because kiln could not export, import or build it."""


@dataclass
class SymbolicDim:
    """One dimension of a graph input that dynamo made symbolic, and its profile range."""

    arg: int            # index among the tensor arguments the engine takes
    dim: int
    symbol: str
    lo: int
    opt: int
    hi: int


class _SymbolicCall(torch.nn.Module):
    """A dynamo graph with symbolic sizes called with its tensors only: each SymInt argument is read from the shape
    of the tensor dimension that carries the same symbol, so the export keeps it symbolic."""

    def __init__(self, gm: torch.fx.GraphModule, n_args: int, sources: dict[int, tuple[int, int]]):
        super().__init__()
        self.gm, self.n_args, self.sources = gm, n_args, sources  # sources: SymInt arg index → (tensor index, dim)

    def forward(self, *args):  # named args: CompiledModule calls its inputs args.0, args.1, ...
        it = iter(args)
        full = [None if i in self.sources else next(it) for i in range(self.n_args)]
        for i, (t, d) in self.sources.items():
            full[i] = args[t].shape[d]
        return self.gm(*full)


def _range(size: torch.SymInt) -> tuple[int, int, int] | None:
    """(min, opt, max) of the profile for a plain symbolic size (see the module's docstring); None for a size that
    is an expression of symbols (s0*2) or has no hint."""
    import sympy
    from torch.utils._sympy.numbers import int_oo

    node = size.node
    if not isinstance(node.expr, sympy.Symbol) or node.hint is None:
        return None
    opt = int(node.hint)
    bounds = node.shape_env.var_to_range.get(node.expr)
    lower = int(bounds.lower) if bounds is not None and bounds.lower not in (int_oo, -int_oo) else 1
    upper = int(bounds.upper) if bounds is not None and bounds.upper not in (int_oo, -int_oo) else None
    lo = lower if lower > 2 else 1
    hi = upper if upper is not None else max(DYNAMIC_MAX, DYNAMIC_FACTOR * opt)
    return min(lo, opt), opt, max(hi, opt)


def symbolic_dims(gm: torch.fx.GraphModule) -> tuple[list[SymbolicDim], dict[int, tuple[int, int]], list[int]] | None:
    """The symbolic sizes of a dynamo graph's inputs: (dims, SymInt argument index → (tensor argument index, dim)
    it is read from, indices of the tensor arguments); None when the graph is static or its symbols are not plain
    input sizes (then it is compiled per input signature)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [n.meta.get("example_value") for n in placeholders]
    if any(v is None for v in values):
        return None
    tensors = [i for i, v in enumerate(values) if not isinstance(v, torch.SymInt)]
    dims: list[SymbolicDim] = []
    where: dict[str, tuple[int, int]] = {}
    for j, i in enumerate(tensors):
        v = values[i]
        if not isinstance(v, torch.Tensor):
            return None
        for d, size in enumerate(v.shape):
            if not isinstance(size, torch.SymInt):
                continue
            r = _range(size)
            if r is None:
                return None
            symbol = str(size.node.expr)
            dims.append(SymbolicDim(j, d, symbol, *r))
            where.setdefault(symbol, (j, d))
    if not dims:
        return None
    sources = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.SymInt):
            if str(v.node.expr) not in where:
                return None
            sources[i] = where[str(v.node.expr)]
    return dims, sources, tensors


class KilnGraph:
    """A dynamo graph as kiln engines: one per input signature for a static graph, one dynamic engine for a graph
    with symbolic sizes; signatures kiln cannot build run the graph itself.

    `builds` counts the engines this graph built."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict):
        self.gm = gm
        self.options = options
        self.placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
        self.failed: dict = {}  # signature → why kiln could not build it
        found = symbolic_dims(gm)
        self.dims: list[SymbolicDim] = found[0] if found else []
        if found:
            _, sources, tensors = found
            self.tensor_args = tensors
            self.targets = [self.placeholders[i] for i in tensors]
            self.module: torch.nn.Module = _SymbolicCall(gm, len(self.placeholders), sources)
        else:
            self.tensor_args, self.targets, self.module = None, self.placeholders, gm
        self._built = 0
        self.compiled = self._compiled()

    @property
    def dynamic(self) -> bool:
        """Whether this graph has symbolic sizes, served by one dynamic engine."""
        return bool(self.dims)

    @property
    def builds(self) -> int:
        return self._built + self.compiled.builds

    def _compiled(self) -> CompiledModule:
        dynamic: dict[str, dict[int, tuple[int, int]]] = {}
        for s in self.dims:
            dynamic.setdefault(f"args.{s.arg}", {})[s.dim] = (s.lo, s.hi)
        options = dict(self.options, dynamic=dynamic) if dynamic else self.options
        return CompiledModule(self.module, None, freeze=self._is_weight, **options)

    def _is_weight(self, name: str, value: torch.Tensor) -> bool:
        """A parameter or buffer of the compiled module, which dynamo passes as an argument: `args.3` (or the
        placeholder's own name) whose placeholder reads like `L_self_modules_bn_buffers_running_mean_`."""
        if isinstance(value, torch.nn.Parameter):
            return True
        m = re.fullmatch(r"args\.(\d+)", name)
        target = self.targets[int(m.group(1))] if m and int(m.group(1)) < len(self.targets) else name
        return re.search(r"_(parameters|buffers)_", str(target)) is not None

    def _widen(self, tensors) -> None:
        """Rebuild the dynamic engine's profile (at the next call) to cover sizes outside it."""
        wider = False
        for s in self.dims:
            n = tensors[s.arg].shape[s.dim]
            if not s.lo <= n <= s.hi:
                s.lo, s.hi, wider = min(s.lo, n), max(s.hi, 2 * n), True
        if wider:
            self._built += self.compiled.builds
            self.compiled = self._compiled()

    def __call__(self, *args):
        call = args if self.tensor_args is None else tuple(args[i] for i in self.tensor_args)
        if self.dims:
            self._widen(call)
        key = self.compiled.key(*call)
        if key in self.failed:
            return self.gm(*args)
        try:
            return self.compiled(*call)
        except ConfigError:  # the user's options: theirs to fix, not a reason to fall back
            raise
        except Exception as e:  # KilnError (an op kiln cannot import, ...) or an exporter bug: run in torch
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.failed[key] = why
        warnings.warn(f"kiln backend: this graph runs in torch instead ({why})", KilnFallbackWarning, stacklevel=2)
        return self.gm(*args)


def kiln_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_ignored):
    """A torch.compile backend (`backend="kiln"`; options through `options={...}`: kiln.compile's keywords, e.g.
    `{"device": "cpu", "fp16": True}`). Engines are built lazily, at the first call: one per input signature for a
    static graph, one dynamic engine for a graph dynamo gave symbolic sizes (see this module's docstring)."""
    graph = KilnGraph(gm, dict(options or {}))
    return torch._dynamo.disable(graph)
