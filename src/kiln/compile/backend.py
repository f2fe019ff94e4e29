"""The `torch.compile(m, backend="kiln")` backend: each graph dynamo captures (one per partition between graph
breaks) runs as kiln engines, built on the first call for each input signature; a graph kiln cannot export, import
or build runs as torch's own GraphModule, with a KilnFallbackWarning saying why."""

from __future__ import annotations

import re
import warnings

import torch

from kiln.compile.module import CompiledModule
from kiln.errors import ConfigError


class KilnFallbackWarning(UserWarning):
    """A graph runs in torch because kiln could not export, import or build it."""


class KilnGraph:
    """A dynamo graph as kiln engines, one per input signature; signatures kiln cannot build run the graph itself."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict):
        self.gm = gm
        self.placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
        self.compiled = CompiledModule(gm, None, freeze=self._is_weight, **options)
        self.failed: dict = {}  # signature → why kiln could not build it

    def _is_weight(self, name: str, value: torch.Tensor) -> bool:
        """A parameter or buffer of the compiled module, which dynamo passes as an argument: `args.3` (or the
        placeholder's own name) whose placeholder reads like `L_self_modules_bn_buffers_running_mean_`."""
        if isinstance(value, torch.nn.Parameter):
            return True
        m = re.fullmatch(r"args\.(\d+)", name)
        target = self.placeholders[int(m.group(1))] if m and int(m.group(1)) < len(self.placeholders) else name
        return re.search(r"_(parameters|buffers)_", str(target)) is not None

    def __call__(self, *args):
        key = self.compiled.key(*args)
        if key in self.failed:
            return self.gm(*args)
        try:
            return self.compiled(*args)
        except ConfigError:  # the user's options: theirs to fix, not a reason to fall back
            raise
        except Exception as e:  # KilnError (an op kiln cannot import, ...) or an exporter bug: run in torch
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.failed[key] = why
        warnings.warn(f"kiln backend: this graph runs in torch instead ({why})", KilnFallbackWarning, stacklevel=2)
        return self.gm(*args)


def kiln_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_ignored):
    """A torch.compile backend (`backend="kiln"`; options through `options={...}`: kiln.compile's keywords, e.g.
    `{"device": "cpu", "fp16": True}`). Engines are built lazily, at the first call for each input signature."""
    graph = KilnGraph(gm, dict(options or {}))
    return torch._dynamo.disable(graph)
