"""Reference implementations of the string layer kinds, on numpy object arrays of `str`.

RegexFullMatch accepts only the RE2 subset on which RE2 and Python's `re` agree, translated
by `python_pattern`; anything else is refused rather than matched differently.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import torch

from kiln.kinds.registry import INT, STR, STRS, kind


def _strings(values, shape) -> np.ndarray:
    """A numpy object array of `shape` holding `values` (a flat iterable of str)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


@kind("StringConcat", attrs={})
def string_concat(inputs, attrs):
    x, y = np.broadcast_arrays(*inputs)
    return [_strings([a + b for a, b in zip(x.flat, y.flat)], x.shape)]


@kind("StringSplit", attrs={"delimiter": STR.req, "maxsplit": INT.req})
def string_split(inputs, attrs):
    """Split on `delimiter` (runs of whitespace when empty), at most `maxsplit` times; pad with "".

    An empty string has no substrings (as in ONNX Runtime), whatever the delimiter.
    """
    x = inputs[0]
    parts = [s.split(attrs["delimiter"] or None, attrs["maxsplit"]) if s else [] for s in x.flat]
    width = max((len(p) for p in parts), default=0)
    padded = [w for p in parts for w in p + [""] * (width - len(p))]
    counts = torch.tensor([len(p) for p in parts], dtype=torch.int64).reshape(x.shape)
    return [_strings(padded, (*x.shape, width)), counts]


def _change_case(s: str, upper: bool) -> str:
    """Per-character case change that keeps characters without a one-character mapping (ß), as ORT does."""
    changed = ((c.upper() if upper else c.lower()) for c in s)
    return "".join(m if len(m) == 1 else c for c, m in zip(s, changed))


@kind("StringNormalizer", attrs={"case_change_action": STR.req, "is_case_sensitive": INT.req, "locale": STR,
                                 "stopwords": STRS.req})
def string_normalizer(inputs, attrs):
    """Drop stopwords (case-insensitively unless asked), then change case; [C] or [1, C] input."""
    x = inputs[0]
    sensitive, action = attrs["is_case_sensitive"], attrs["case_change_action"]
    fold = (lambda s: s) if sensitive else (lambda s: _change_case(s, upper=False))
    stops = {fold(w) for w in attrs["stopwords"]}
    kept = [s for s in x.flat if fold(s) not in stops]
    if action != "NONE":
        kept = [_change_case(s, upper=action == "UPPER") for s in kept]
    kept = kept or [""]
    return [_strings(kept, (len(kept),) if x.ndim == 1 else (1, len(kept)))]


_ESCAPES = set("dDwWsStnrfv")           # same meaning in RE2 and `re` (with re.ASCII), in and out of classes
_OUTSIDE_ESCAPES = _ESCAPES | set("bBA")


@functools.lru_cache(maxsize=64)
def python_pattern(pattern: str) -> str:
    """Translate an RE2 pattern into `re` syntax, or raise ValueError naming a construct outside the safe subset."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c, nxt = pattern[i], pattern[i + 1:i + 2]
        if c == "\\":
            if re.fullmatch(r"x[0-9a-fA-F]{2}", pattern[i + 1:i + 4]):
                out.append(pattern[i:i + 4])
                i += 4
                continue
            if nxt == "z" and not in_class:
                out.append(r"\Z")
            elif nxt and (not nxt.isalnum() or nxt in (_ESCAPES if in_class else _OUTSIDE_ESCAPES)):
                out.append(c + nxt)
            else:
                raise ValueError(f"escape \\{nxt} (backreferences, \\p classes, \\Q...\\E and the like are not "
                                 "in the subset kiln runs)")
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
            elif c + nxt in ("[:", "[[", "--", "&&", "~~", "||"):
                raise ValueError(f"{c + nxt!r} inside a character class")
        elif c == "[":
            in_class = True
            j = i + 1 + (nxt == "^")
            if pattern[j:j + 1] == "]":  # a leading ] is literal
                out.append(pattern[i:j + 1])
                i = j + 1
                continue
        elif c == "(" and nxt == "?" and not re.match(r"\(\?(:|P<\w+>)", pattern[i:]):
            raise ValueError("group syntax '(?' other than (?: and (?P<name> (lookaround and inline flags)")
        elif c in "*+?}" and nxt == "+":
            raise ValueError(f"repetition {c + nxt!r}")
        elif c == "{" and nxt == ",":
            raise ValueError("'{,' (a literal in RE2, a repetition in Python)")
        elif c == "$":
            c = r"\Z"  # RE2's $ matches only at the very end; Python's also before a final newline
        out.append(c)
        i += 1
    if in_class:
        raise ValueError("unterminated character class")
    return "".join(out)


@kind("RegexFullMatch", attrs={"pattern": STR.req})
def regex_full_match(inputs, attrs):
    x = inputs[0]
    regex = re.compile(python_pattern(attrs["pattern"]), re.ASCII)
    return [torch.tensor([regex.fullmatch(s) is not None for s in x.flat], dtype=torch.bool).reshape(x.shape)]
