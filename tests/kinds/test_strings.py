"""String ops against ONNX Runtime, RE2→Python pattern translation, and the errors for what kiln refuses."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from test_controlflow import check_model, model, vi

import kiln
from kiln.errors import UnsupportedOpError
from kiln.kinds.strings import python_pattern
from opcheck import DEVICE

S = T.STRING
UNICODE = {"locale": "C.UTF-8"}  # ORT's default, en_US.UTF-8, needs a language pack; this one is always there


def strings(*values, shape=None):
    return np.array(values, dtype=object).reshape(shape or (len(values),))


def one_node(op, attrs=None, inputs=("x",), outputs=("y",), shape=(None,), opset=20):
    """One node with string inputs of `shape` (None: a symbolic dimension)."""
    node = h.make_node(op, list(inputs), list(outputs), **(attrs or {}))
    m = model([node], [vi(i, S, list(shape)) for i in inputs], [h.make_empty_tensor_value_info(o) for o in outputs],
              opset=opset)
    return onnx.shape_inference.infer_shapes(m)


def test_string_concat_broadcasts():
    check_model(one_node("StringConcat", inputs=("a", "b"), shape=(None, None)),
                {"a": strings("x", "", "é", "ab", shape=(2, 2)), "b": strings("1", "2", shape=(1, 2))})


@pytest.mark.parametrize("attrs", [{}, {"delimiter": ","}, {"delimiter": "--", "maxsplit": 1}, {"maxsplit": 1}])
def test_string_split(attrs):
    m = one_node("StringSplit", attrs, outputs=("y", "n"), shape=(None, None))
    check_model(m, {"x": strings(" a  b c", "a,,b--c,d", "", "x--y--z", shape=(2, 2))})


@pytest.mark.parametrize("attrs", [{"case_change_action": "UPPER", "stopwords": ["monday"]},
                                   {"case_change_action": "LOWER", "is_case_sensitive": 1, "stopwords": ["Monday"]},
                                   {"stopwords": ["a", "b"]}])
@pytest.mark.parametrize("shape", [(4,), (1, 4)])
def test_string_normalizer(attrs, shape):
    dims = (None,) if len(shape) == 1 else (1, None)
    check_model(one_node("StringNormalizer", attrs | UNICODE, shape=dims, opset=10),
                {"x": strings("Monday", "tuesday", "ßtraße", "monday", shape=shape)})


def test_string_normalizer_all_dropped():
    check_model(one_node("StringNormalizer", {"stopwords": ["a"]} | UNICODE, shape=(1, None), opset=10),
                {"x": strings("a", "A", shape=(1, 2))})


@pytest.mark.parametrize("pattern", [r"www\.[\w.-]+\.\bcom\b", r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)",
                                     r"a$", r"[]a]+b?", r"\d{2,3}x*?", r"(?P<w>\w+)\s(?:\S)+", r"[^\d\s]+\z"])
def test_regex_full_match(pattern):
    x = strings("www.example.com", "a", "a\n", "]a]b", "123xx", "ab cd", "héllo", "x@gmail.com", "9 ", "")
    check_model(one_node("RegexFullMatch", {"pattern": pattern}, outputs=("y",)), {"x": x})


@pytest.mark.parametrize("pattern, what", [(r"(a)\1", "escape"), (r"a(?=b)", "group syntax"), (r"(?i)a", "group"),
                                           (r"\p{L}", "escape"), (r"a*+", "repetition"), (r"[[:alpha:]]", "class"),
                                           (r"a{,2}", "literal in RE2"), (r"[ab", "unterminated")])
def test_regex_outside_the_safe_subset_is_refused(pattern, what):
    with pytest.raises(ValueError, match=what):
        python_pattern(pattern)
    m = one_node("RegexFullMatch", {"pattern": pattern}, outputs=("y",))
    with pytest.raises(UnsupportedOpError, match="RE2"):
        kiln.build(m, kiln.BuildConfig(device=DEVICE))


def test_unsupported_locale_is_refused():
    with pytest.raises(UnsupportedOpError, match="locale='C' is not supported"):
        kiln.build(one_node("StringNormalizer", {"locale": "C"}, opset=10), kiln.BuildConfig(device=DEVICE))


def test_string_outputs_survive_a_plan_round_trip(tmp_path):
    engine = kiln.build(one_node("StringConcat", inputs=("a", "b")), kiln.BuildConfig(device=DEVICE))
    engine.save(tmp_path / "m.plan")
    got = kiln.load(tmp_path / "m.plan").run({"a": strings("p", "q"), "b": strings("!")})["y"]
    assert got.dtype == object and got.tolist() == ["p!", "q!"]
