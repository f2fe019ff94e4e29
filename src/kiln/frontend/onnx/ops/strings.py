"""ONNX importers for the string ops; unsupported attribute values are refused at import."""

from __future__ import annotations

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register, register_direct
from kiln.kinds.strings import python_pattern

register_direct("StringConcat", since=20)

# Locales whose case mapping is Unicode's default, which is what the reference implements
# ("C" and "POSIX" map ASCII letters only, so they are not among them).
_LOCALES = ("", "en_US", "en_US.UTF-8", "en_US.utf8", "C.UTF-8", "C.utf8")


@register("StringSplit", since=20)
def string_split(node: OnnxNode, ctx: ImportContext) -> None:
    maxsplit = node.attr("maxsplit", -1)
    if maxsplit < -1:
        raise ModelError(f"{node.where()}: maxsplit={maxsplit} must not be negative")
    ctx.emit(node, "StringSplit", node.inputs, node.outputs,
             {"delimiter": node.attr("delimiter", ""), "maxsplit": maxsplit})


@register("StringNormalizer", since=10)
def string_normalizer(node: OnnxNode, ctx: ImportContext) -> None:
    layer = direct("StringNormalizer", node, ctx)
    a = layer.attrs
    a.setdefault("stopwords", [])
    if a["case_change_action"] not in ("NONE", "LOWER", "UPPER"):
        raise ModelError(f"{node.where()}: case_change_action={a['case_change_action']!r} is not NONE, LOWER or UPPER")
    if a.pop("locale", "") not in _LOCALES:
        raise UnsupportedOpError(f"{node.where()}: locale={node.attr('locale')!r} is not supported; kiln applies "
                                 f"Unicode's default case mapping (locales {', '.join(map(repr, _LOCALES))})")


@register("RegexFullMatch", since=20)
def regex_full_match(node: OnnxNode, ctx: ImportContext) -> None:
    pattern = node.attr("pattern")
    if pattern is None:
        raise ModelError(f"{node.where()}: attribute 'pattern' is required")
    try:
        python_pattern(pattern)
    except ValueError as e:
        raise UnsupportedOpError(f"{node.where()}: pattern {pattern!r} uses {e}; kiln runs only the RE2 syntax "
                                 "that Python's re matches identically; rewrite the pattern without it") from None
    ctx.emit(node, "RegexFullMatch", node.inputs, node.outputs, {"pattern": pattern})
