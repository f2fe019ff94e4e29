"""The tactic table, kind by kind, against a recorded snapshot (quant_tactic_table.json): for every layer kind in
registry.BY_KIND after `import kiln.tactics.library`, its tactics in registration order (which breaks ties between
equal priorities) with their priority, kinds, flags and the functions they compile, check and configure with.

Recorded before issue 26 part 3 moved the quantized registrations into one module per layer kind
(tactics/quant_gemm.py, quant_conv.py, quant_conv_pair.py, quant_conv_chain.py); that change made the launch,
check and config functions public, so RENAMED maps the names the snapshot holds to the ones they have now.
A change that means to move a choice updates the snapshot: `python tests/tactics/test_quant_tactic_table.py --write`
(then empty RENAMED).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("quant_tactic_table.json")
FLAGS = ("backends", "untimed", "arch_specific", "card_specific", "writes_out", "fresh")

# function names in the snapshot -> their names now (empty: the snapshot was written with today's names)
RENAMED: dict[str, str] = {}


def _function(f) -> dict | str | None:
    """A function as `module:qualname`, with what its closure binds (the layer and device checks of a variant)."""
    if f is None:
        return None
    name = f"{f.__module__}:{f.__qualname__}"
    cells = dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__ or ())))
    if not cells:
        return name
    return {"function": name, "binds": {k: _value(v) for k, v in sorted(cells.items())}}


def _value(v):
    if callable(v) and hasattr(v, "__qualname__"):
        return _function(v)
    if hasattr(v, "label"):  # a QType
        return v.label
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return type(v).__name__


def table() -> dict[str, list[dict]]:
    from kiln.tactics import library, registry  # noqa: F401  (library registers every tactic)

    return {kind: [{"name": t.name, "priority": t.priority, "kinds": list(t.kinds),
                    **{f: list(getattr(t, f)) if f == "backends" else getattr(t, f) for f in FLAGS},
                    "compile": _function(t.compile), "supports": _function(t.supports),
                    "configs": _function(t.configs)} for t in tactics]
            for kind, tactics in sorted(registry.BY_KIND.items())}


def _renamed(x):
    if isinstance(x, str):
        return RENAMED.get(x, x)
    if isinstance(x, list):
        return [_renamed(v) for v in x]
    if isinstance(x, dict):
        return {k: _renamed(v) for k, v in x.items()}
    return x


def test_tactic_table_matches_snapshot():
    want = _renamed(json.loads(SNAPSHOT.read_text()))
    got = table()
    assert list(got) == list(want), "layer kinds added or gone"
    for kind in want:
        assert [t["name"] for t in got[kind]] == [t["name"] for t in want[kind]], f"{kind}: tactics or order moved"
        assert got[kind] == want[kind], kind


def test_every_tactic_is_listed_under_each_of_its_kinds_once():
    from kiln.tactics import library, registry  # noqa: F401

    for t in registry.TACTICS.values():
        for kind in t.kinds:
            assert [x.name for x in registry.BY_KIND[kind]].count(t.name) == 1, (t.name, kind)
    for kind, tactics in registry.BY_KIND.items():
        for t in tactics:
            assert kind in t.kinds and registry.TACTICS[t.name] is t, (kind, t.name)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write   (records the current table in {SNAPSHOT.name})")
    SNAPSHOT.write_text(json.dumps(table(), indent=1) + "\n")
