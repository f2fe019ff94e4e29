"""JSON from untrusted files, parsed as data with limits: bytes, nesting depth, values, string length.

    data = load_json(path, max_bytes=16 << 20, what="calibration cache", error=ConfigError)

Every failure is the caller's `error` class (a KilnError) with a message naming the file and the fix.
NaN/Infinity literals are refused unless `allow_nan`; duplicate object keys are refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kiln.errors import ConfigError, KilnError

MAX_DEPTH = 64
MAX_VALUES = 10_000_000
MAX_STRING = 16 << 20


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


def _refuse_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def check_limits(value, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES,
                 max_string: int = MAX_STRING) -> None:
    """Raise ValueError if `value` nests deeper, holds more values or longer strings than allowed."""
    stack, count = [(value, 1)], 0
    while stack:
        v, depth = stack.pop()
        count += 1
        if count > max_values:
            raise ValueError(f"more than {max_values} values")
        if depth > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
            if any(len(k) > max_string for k in v):
                raise ValueError(f"a key longer than {max_string} characters")
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, str) and len(v) > max_string:
            raise ValueError(f"a string longer than {max_string} characters")


def printable(value, quote: bool = True) -> str:
    """Untrusted text (or a JSON value) safe to print to a terminal: control and format characters (ESC, \\r, \\n,
    bidi overrides) escaped; quoted as data unless `quote` is False (then only escaped)."""
    if quote or not isinstance(value, str):
        return repr(value)  # repr escapes every character that is not printable
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in value)


def loads_json(data: bytes | str, *, what: str = "JSON", max_bytes: int = 64 << 20, max_depth: int = MAX_DEPTH,
               max_values: int = MAX_VALUES, max_string: int = MAX_STRING, allow_nan: bool = False,
               expect: type | None = dict, error: type[KilnError] = ConfigError, fix: str = "regenerate it"):
    """Parse `data` as JSON within the limits; `expect` is the top-level type (None: any)."""
    if len(data) > max_bytes:
        raise error(f"{what} is {len(data)} bytes, over the {max_bytes} byte limit; {fix}")
    try:
        kw = {} if allow_nan else {"parse_constant": _refuse_constant}
        value = json.loads(data, object_pairs_hook=_no_duplicates, **kw)
        check_limits(value, max_depth=max_depth, max_values=max_values, max_string=max_string)
        if expect is not None and not isinstance(value, expect):
            raise ValueError(f"top level is {type(value).__name__}, not {expect.__name__}")
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise error(f"{what} is not valid JSON ({str(e)[:200]}); {fix}") from None
    return value


def load_json(path: str | os.PathLike, *, max_bytes: int = 64 << 20, what: str | None = None, **kw):
    """Read `path` (a regular file, at most `max_bytes`) and parse it with `loads_json`'s limits."""
    path = Path(path)
    what = f"{what or 'file'} {path}"
    error = kw.get("error", ConfigError)
    if path.is_symlink() or not path.is_file():
        raise error(f"{what} is not a regular file (missing, a folder or a symbolic link); give a file path")
    size = path.stat().st_size
    if size > max_bytes:
        raise error(f"{what} is {size} bytes, over the {max_bytes} byte limit; {kw.get('fix', 'regenerate it')}")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    return loads_json(data, what=what, max_bytes=max_bytes, **kw)
