"""Plugins: supply an ONNX op kiln does not know, as a reference implementation plus a type rule.

    kiln.plugins.register_op("MyOp", my_ref, domain="com.example")

The op then imports as a layer of its own kind and runs wherever its torch reference runs. A plugin is usually a
Python file or module that calls `register_op` when imported: `load_plugin("my_ops.py")` (the CLI's `--plugin`)
imports it. A plan records the plugin ops it uses and the module each came from (its name, file name and source
sha256) as data only: loading a plan never imports anything it names; import the plugin before `kiln.load`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

from kiln.errors import ConfigError
from kiln.frontend.onnx.registry import IMPORTERS, ImportContext, OnnxNode, register
from kiln.ir import DType
from kiln.kinds.registry import KINDS, LayerKind, Reference

TypeRule = Callable[[list[tuple[DType, tuple | None]], dict], list[tuple[DType, tuple | None]]]

_loading: list[dict[str, str]] = []  # the source of the plugin load_plugin is importing, innermost last
_loaded: dict[str, tuple[dict[str, str], list[str]]] = {}  # resolved file → (its source, the kinds it registered)


def same_as_first_input(types, attrs):
    """Default type rule: every output has the first input's dtype and shape."""
    return [types[0]]


def register_op(op_type: str, reference: Reference, *, domain: str = "", since: int = 1,
                types: TypeRule = same_as_first_input) -> str:
    """Register `op_type` of `domain`; returns the layer kind's name. `types` gives output (dtype, shape)s.
    Registering a plugin op again (a plugin loaded again) replaces it."""
    name = f"{domain}::{op_type}" if domain else op_type
    old = KINDS.get(name)
    if old is None or old.plugin is not None:
        if old is not None:  # this plugin op's earlier importer gives way to the new one
            versions = IMPORTERS.get((domain, op_type), [])
            versions[:] = [(v, fn) for v, fn in versions if v != since]
        KINDS[name] = LayerKind(name, reference, plugin=_loading[-1] if _loading else _caller_source())

    @register(op_type, since=since, domain=domain)
    def _import(node: OnnxNode, ctx: ImportContext) -> None:
        net = ctx.network
        in_types = [(net.tensors[i].dtype, net.tensors[i].shape) if i else None for i in node.inputs]
        ctx.emit(node, name, node.inputs, node.outputs, node.attrs)
        for out, (dtype, shape) in zip(node.outputs, types(in_types, node.attrs)):
            if out and out not in net.tensors:
                net.add_tensor(out, dtype, shape)

    return name


def _source(module: str, file: str | None, data: bytes | None = None) -> dict[str, str]:
    """A plugin's source as a plan records it: module name, file name (no folder) and the sha256 of its bytes."""
    if data is None and file:
        try:
            data = Path(file).read_bytes()
        except OSError:
            data = None
    return {"module": module, "file": Path(file).name if file else "",
            "sha256": hashlib.sha256(data).hexdigest() if data is not None else ""}


def _caller_source() -> dict[str, str]:
    """The source of the module that called register_op (outside load_plugin)."""
    frame = sys._getframe(2)
    return _source(str(frame.f_globals.get("__name__", "")), frame.f_globals.get("__file__"))


def _import(spec: str, source: dict[str, str], do_import: Callable[[], object]) -> None:
    _loading.append(source)
    try:
        do_import()
    except Exception as e:
        message = " ".join(str(e).split()) or "(no message)"
        raise ConfigError(f"plugin {spec}: importing it failed: {type(e).__name__}: {message}") from e
    finally:
        _loading.pop()


def _registered_by(source: dict[str, str]) -> list[str]:
    return sorted(name for name, k in KINDS.items() if k.plugin == source)


def load_plugin(spec: str | os.PathLike) -> list[str]:
    """Import a plugin: a Python file (`my_ops.py`) or an importable module (`my_pkg.ops`) that registers ops with
    `register_op`; returns the kinds it registered. A file loaded before, unchanged, is not imported again. A
    missing file or module, an import that fails, or a plugin that registers no op is a ConfigError."""
    text = str(spec)
    if text.endswith(".py") or "/" in text or os.sep in text or Path(text).is_file():
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"plugin {text}: no such file")
        data = path.read_bytes()
        source = _source(path.stem, path.name, data)
        key = str(path.resolve())
        seen = _loaded.get(key)
        if seen and seen[0] == source and seen[1] and seen[1] == _registered_by(source):
            return seen[1]
        name = f"kiln_plugin_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{source['sha256'][:12]}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ConfigError(f"plugin {text}: not a Python file kiln can import")
        module = importlib.util.module_from_spec(module_spec)

        def run_file():
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise

        _import(text, source, run_file)
        kinds = _registered_by(source)
        _loaded[key] = (source, kinds)
    else:
        if text not in sys.modules:
            try:
                found = importlib.util.find_spec(text)
            except Exception as e:  # a parent package that fails to import, or is not a package
                raise ConfigError(f"plugin {text}: importing it failed: {type(e).__name__}: {e}") from e
            if found is None:
                raise ConfigError(f"plugin {text}: no such file or importable module")
            _import(text, _source(text, found.origin if found.has_location else None),
                    lambda: importlib.import_module(text))
        kinds = sorted(name for name, k in KINDS.items() if k.plugin and k.plugin["module"] == text)
    if not kinds:
        raise ConfigError(f"plugin {text} registers no ops: it must call kiln.plugins.register_op(...) when imported")
    return kinds
