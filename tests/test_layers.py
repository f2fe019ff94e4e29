"""Imports point down: each kiln package imports only its own layer or those below it (DESIGN.md, "Layers").

The check reads the source (module-level and deferred imports alike), as ../shared/tools/check_layers.py does,
so an upward import fails here even where it would not run at import time. A lower layer that needs something from
above receives it as an argument (calibration its executor from kinds/interpret.py, the builder its Engine class).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# low to high; a module may import only its own layer or below
ORDER = [["errors", "version"], ["target", "util"], ["ir"], ["kinds"], ["frontend"], ["passes"], ["quant"],
         ["kernels"], ["tactics"], ["builder"], ["engine"], ["runtime"], ["bench", "accuracy", "plugins"],
         ["serve", "conformance", "onnx_backend", "demo", "compile", "session", "api"], ["cli"]]
RANK = {name: i for i, names in enumerate(ORDER) for name in names}
UNRANKED = ("__init__", "__main__", "config")  # the package facade and entry point may import anything; config aside


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "kiln" else None


def _imports(tree: ast.AST):
    """(line, module, imported names, package) of every absolute kiln import in `tree`, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, [a.name for a in node.names], _top(node.module)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _top(a.name):
                    yield node.lineno, a.name, [], _top(a.name)


def check(src: Path) -> tuple[list[str], list[str], set[str]]:
    """(upward imports, cross-module private imports, packages missing from ORDER) of the kiln package in `src`."""
    root = src / "kiln"
    up, private, unknown = [], [], set()
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        me = rel.parts[0].removesuffix(".py")
        if me in UNRANKED:
            continue
        for line, module, names, other in _imports(ast.parse(f.read_text(), str(f))):
            if other is None or other in UNRANKED:
                continue
            if other == me:  # within a package: private names only from the module's own package
                private += [f"{rel}: from {module} import {n}" for n in names
                            if n.startswith("_") and not n.startswith("__") and module.count(".") > 1]
                continue
            if me not in RANK or other not in RANK:
                unknown.add(me if me not in RANK else other)
                continue
            if RANK[other] > RANK[me]:
                up.append(f"{rel}:{line}: {me} imports {module} (layer {other})")
            private += [f"{rel}: from {module} import {n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    return up, private, unknown


def test_imports_point_down():
    up, _, unknown = check(SRC)
    assert not up, "upward imports (move the code down, or pass it in as an argument):\n" + "\n".join(up)
    assert not unknown, f"packages not in the layer order (add them to ORDER here and in DESIGN.md): {unknown}"


def test_config_sits_on_the_lowest_layers():
    """BuildConfig validates only its own fields: it may import errors, version, target and util, nothing above."""
    tree = ast.parse((SRC / "kiln" / "config.py").read_text())
    above = [f"config.py:{line}: {module}" for line, module, _, other in _imports(tree)
             if other is not None and RANK.get(other, len(ORDER)) > RANK["util"]]
    assert not above, "config imports from above the lowest layers:\n" + "\n".join(above)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "kiln" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_check_reports_upward_imports_deferred_ones_too(tmp_path):
    src = _tree(tmp_path, {
        "__init__.py": "from kiln.cli import app\n",                        # the facade may import anything
        "config.py": "from kiln.quant import calibrators\n",                 # config aside
        "ir/__init__.py": "",
        "ir/network.py": "from kiln.errors import InternalError\n"           # down: fine
                         "def verify():\n    from kiln.kinds import registry\n",   # deferred, still upward
        "kinds/interpret.py": "import kiln.runtime.context\n",              # plain import form
        "builder/build.py": "from kiln.builder.autotune import tune\nfrom kiln.tactics import registry\n",
        "quant/budget.py": "from kiln.config import BuildConfig\n",
    })
    up, private, unknown = check(src)
    assert up == ["ir/network.py:3: ir imports kiln.kinds (layer kinds)",
                  "kinds/interpret.py:1: kinds imports kiln.runtime.context (layer runtime)"]
    assert not private and not unknown


def test_the_check_reports_private_names_and_unknown_packages(tmp_path):
    src = _tree(tmp_path, {
        "tactics/triton_conv.py": "from kiln.tactics.triton_gemm import _epilogue, __all__\n",
        "runtime/context.py": "from kiln.kinds.interpret import _first_line\n",
        "quant/int8.py": "from kiln.quant import _helpers\n",  # the package's own private module: allowed
        "newpkg/x.py": "from kiln.ir import Network\n",
    })
    up, private, unknown = check(src)
    assert not up
    assert private == ["runtime/context.py: from kiln.kinds.interpret import _first_line",
                       "tactics/triton_conv.py: from kiln.tactics.triton_gemm import _epilogue"]
    assert unknown == {"newpkg"}
