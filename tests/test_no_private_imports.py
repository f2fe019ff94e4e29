"""No module in src/kiln uses another module's `_private` names (DESIGN.md, "Layers": promote what is shared).

Read from the source with ast, deferred imports included: `from kiln.x.y import _name` (absolute or relative) where
kiln.x.y is not the importing module, and `mod._name` where `mod` is a kiln module bound by an import. A package's own
private submodule (`from kiln.quant import _helpers` inside kiln/quant/) is allowed. tests/test_layers.py checks
the layering itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layers import _tree

SRC = Path(__file__).resolve().parents[1] / "src"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(root: Path, f: Path) -> tuple[str, str]:
    """(the module's dotted name, its package's) of file `f` under `root` (the folder holding kiln/)."""
    parts = list(f.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    """The module a `from ... import` reads, relative forms resolved against `package`."""
    if node.level == 0:
        return node.module
    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(root: Path, dotted: str) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def violations(root: Path) -> list[str]:
    """Every use of another kiln module's private name in the kiln package under `root`, as 'file:line: what'."""
    found = []
    for f in sorted((root / "kiln").rglob("*.py")):
        me, package = _module_name(root, f)
        rel = f.relative_to(root / "kiln")
        tree = ast.parse(f.read_text(), str(f))
        modules = {}  # local name -> the kiln module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, package)
                if not source or not (source == "kiln" or source.startswith("kiln.")):
                    continue
                for a in node.names:
                    sub = f"{source}.{a.name}"
                    if _is_module(root, sub):
                        modules[a.asname or a.name] = sub
                        if _private(a.name) and source != package:
                            found.append(f"{rel}:{node.lineno}: from {source} import {a.name}")
                    elif _private(a.name) and source != me:
                        found.append(f"{rel}:{node.lineno}: from {source} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("kiln.") and a.asname:
                        modules[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name) \
                    and modules.get(node.value.id, me) != me and not _is_module(root, f"{modules[node.value.id]}"
                                                                                    f".{node.attr}"):
                found.append(f"{rel}:{node.lineno}: {modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_anothers_private_names():
    found = violations(SRC)
    assert not found, "private names used across modules (make the shared helper public):\n" + "\n".join(found)


def test_the_check_catches_private_imports_and_uses(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "tactics/__init__.py": "",
        "tactics/triton_gemm.py": "def _epilogue(a):\n    return a\n\ndef run():\n    return _epilogue(1)\n",
        "tactics/triton_int8.py": "from kiln.tactics.triton_gemm import _epilogue, __doc__, run\n",
        "tactics/triton_conv.py": "def f():\n    from .triton_gemm import _epilogue\n    return _epilogue\n",
        "tactics/views.py": "from kiln.tactics import triton_gemm as g\n\ng._epilogue(1)\ng.run()\n",
        "quant/__init__.py": "",
        "quant/_helpers.py": "X = 1\n",
        "quant/int8.py": "from kiln.quant import _helpers\n",  # the package's own private module: allowed
        "runtime/context.py": "from kiln.quant import _helpers\n",  # another package's: not
    })
    assert violations(root) == [
        "runtime/context.py:1: from kiln.quant import _helpers",
        "tactics/triton_conv.py:2: from kiln.tactics.triton_gemm import _epilogue",
        "tactics/triton_int8.py:1: from kiln.tactics.triton_gemm import _epilogue",
        "tactics/views.py:3: kiln.tactics.triton_gemm._epilogue",
    ]


def test_the_check_passes_public_and_own_names(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "tactics/__init__.py": "",
        "tactics/triton_common.py": "def epilogue(a):\n    return a\n",
        "tactics/triton_gemm.py": "from kiln.tactics.triton_common import epilogue\n\ndef _own():\n    return 1\n"
                                  "\n_own()\n",
    })
    assert violations(root) == []
