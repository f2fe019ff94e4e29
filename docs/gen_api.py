"""Generate docs/api.md, kiln's Python API reference, from the docstrings of the public API.

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --check    # exit 1 if docs/api.md is out of date (tests/test_docs.py does this)

Standard library only (inspect, importlib, dataclasses): what it documents is what `import kiln` exposes. Names that
do not exist (yet) in this kiln, such as `kiln.compile` or `kiln.InferenceSession`, are left out rather than guessed.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

OUT = Path(__file__).with_name("api.md")

# (title, dotted name) in the order the reference shows them; optional ones are skipped when absent
FUNCTIONS = ["kiln.build", "kiln.load", "kiln.compile"]
CLASSES = ["kiln.BuildConfig", "kiln.ShapeRange", "kiln.Engine", "kiln.runtime.ExecutionContext",
           "kiln.InferenceSession"]
ERRORS_MODULE = "kiln.errors"


def resolve(dotted: str):
    """The object named `dotted` (module path, then attributes), or None when it does not exist."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


def doc(obj) -> str:
    """The object's own docstring, dedented; '(no docstring)' if it has none."""
    text = inspect.getdoc(obj) if obj is not None else None
    if text and isinstance(obj, type) and text == inspect.getdoc(object):
        text = None
    return text or "(no docstring)"


def _annotation(a) -> str:
    """An annotation as written in the source (kiln uses `from __future__ import annotations`: strings)."""
    return a.strip("'\"") if isinstance(a, str) else inspect.formatannotation(a)


def signature(name: str, obj, drop_first: bool = False) -> str:
    """`name(params) -> return`, annotations unquoted; `drop_first` leaves out `self` / `cls`."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = list(sig.parameters.values())[1 if drop_first else 0:]
    parts, star_done = [], False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
        parts.append(text)
    ret = f" -> {_annotation(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    return f"{name}({', '.join(parts)}){ret}"


def fence(code: str) -> str:
    return f"```python\n{code}\n```\n"


def function_section(dotted: str, obj, level: str = "##", drop_first: bool = False) -> str:
    return f"{level} `{dotted}`\n\n{fence(signature(dotted, obj, drop_first))}\n{doc(obj)}\n"


def public_methods(cls) -> list[tuple[str, object]]:
    """Methods and properties defined on `cls` itself (not inherited from object), public names only, in source
    order."""
    out = []
    for name, member in cls.__dict__.items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            out.append((name, member.__func__))
        elif isinstance(member, property) or inspect.isfunction(member):
            out.append((name, member))
    return out


def dataclass_fields(cls) -> str:
    rows = ["| field | type | default |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = repr(f.default_factory())  # type: ignore[misc]
        else:
            default = "(required)"
        ftype = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append(f"| `{f.name}` | `{ftype}` | `{default}` |")
    return "\n".join(rows) + "\n"


def class_section(dotted: str, cls) -> str:
    parts = [f"## `{dotted}`\n\n{doc(cls)}\n"]
    if dataclasses.is_dataclass(cls):
        parts.append(f"Fields (a frozen dataclass):\n\n{dataclass_fields(cls)}")
    for name, member in public_methods(cls):
        qual = f"{dotted}.{name}"
        if isinstance(member, property):
            parts.append(f"### `{qual}` (property)\n\n{doc(member.fget)}\n")
        else:
            kind = "classmethod" if isinstance(cls.__dict__[name], classmethod) else \
                "staticmethod" if isinstance(cls.__dict__[name], staticmethod) else None
            title = f"{qual}" + (f" ({kind})" if kind else "")
            parts.append(function_section(qual, member, "###", drop_first=kind != "staticmethod")
                         .replace(f"### `{qual}`", f"### `{title}`".replace(f" ({kind})`", f"` ({kind})"), 1))
    return "\n".join(parts)


def module_section(dotted: str, mod) -> str | None:
    """A module (e.g. a subpackage kiln exposes as `kiln.NAME`): its docstring and the functions and classes of its
    `__all__`; None when it has neither (a package still being written)."""
    names = list(getattr(mod, "__all__", ()))
    if not names and not mod.__doc__:
        return None
    parts = [f"## `{dotted}` (module)\n\n{doc(mod)}\n"]
    for name in names:
        obj = getattr(mod, name, None)
        if isinstance(obj, type):
            parts.append(class_section(f"{dotted}.{name}", obj).replace("## ", "### ", 1))
        elif callable(obj):
            parts.append(function_section(f"{dotted}.{name}", obj, "###"))
    return "\n".join(parts)


def errors_section() -> str:
    mod = importlib.import_module(ERRORS_MODULE)
    classes = [c for _, c in inspect.getmembers(mod, inspect.isclass)
               if c.__module__ == mod.__name__ and issubclass(c, Exception)]
    classes.sort(key=lambda c: inspect.getsourcelines(c)[1])
    rows = ["| error | base | exit code | meaning |", "|---|---|---|---|"]
    for c in classes:
        base = c.__bases__[0].__name__
        code = getattr(c, "exit_code", "")
        rows.append(f"| `{mod.__name__}.{c.__name__}` | `{base}` | {code} | {doc(c).splitlines()[0]} |")
    intro = doc(mod)
    return (f"## Errors (`{mod.__name__}`)\n\n{intro}\n\n" + "\n".join(rows) + "\n\n"
            "What each message means and what to do: [troubleshooting.md](troubleshooting.md).\n")


def generate() -> str:
    import kiln

    out = ["# kiln Python API reference\n",
           "<!-- Generated by docs/gen_api.py from the docstrings; do not edit by hand. "
           "Regenerate with `python docs/gen_api.py`; tests/test_docs.py fails when this file is stale. -->\n",
           f"{doc(kiln)}\n",
           "A walk-through with examples is in [user-guide.md](user-guide.md).\n"]
    missing = []
    for dotted in FUNCTIONS:
        obj = resolve(dotted)
        if inspect.ismodule(obj):
            section = module_section(dotted, obj)
            out.append(section) if section else missing.append(dotted)
        elif callable(obj):
            out.append(function_section(dotted, obj))
        else:
            missing.append(dotted)
    for dotted in CLASSES:
        obj = resolve(dotted)
        if obj is None:
            missing.append(dotted)
        else:
            out.append(class_section(dotted, obj))
    out.append(errors_section())
    if missing:
        out.append("## Not in this version\n\n" + ", ".join(f"`{m}`" for m in missing)
                   + ": not part of this kiln's API (yet).\n")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date; run `python docs/gen_api.py`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
