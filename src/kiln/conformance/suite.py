"""Run ONNX's backend test suite (node, simple, pytorch-converted, pytorch-operator) through kiln.

Each test ends as one `Outcome`: passed, failed (wrong result), error (kiln raised), or excluded.
"""

from __future__ import annotations

import re
import unittest
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

from kiln.conformance.exclusions import EXCLUDED

CATEGORIES = {"OnnxBackendNodeModelTest": "node", "OnnxBackendSimpleModelTest": "simple",
              "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
              "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator", "OnnxBackendRealModelTest": "real"}


@dataclass
class Outcome:
    """The result of one backend test on one device."""

    name: str          # harness name without the device suffix, e.g. test_abs
    category: str      # node, simple, pytorch-converted, pytorch-operator, real
    op: str            # the op under test (node tests), else the category
    status: str        # passed, failed, error, excluded, skipped
    reason: str = ""


def node_ops() -> dict[str, str]:
    """Node test name → the op it tests (expanded function tests map to the op they expand)."""
    from onnx.backend.test.loader import load_node_model_tests

    ops: dict[str, str] = {}
    cases = load_node_model_tests()
    for c in cases:
        types = [n.op_type for n in c.model.graph.node]
        if len(set(types)) == 1:
            ops[c.name] = types[0]
    for c in cases:
        if c.name not in ops:
            base = re.sub(r"_expanded.*$", "", c.name)
            ops[c.name] = ops.get(base) or _guess_op(c.name, [n.op_type for n in c.model.graph.node])
    return ops


def _guess_op(name: str, types: list[str]) -> str:
    """Pick the op whose snake_case name the test name starts with (longest wins)."""
    snake = {re.sub(r"(?<!^)(?=[A-Z])", "_", t).lower(): t for t in types}
    best = max((s for s in snake if name.startswith("test_" + s)), key=len, default=None)
    return snake[best] if best else "+".join(sorted(set(types)))


def _first_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    for line in reversed(lines):  # the exception line is last in a traceback
        if re.match(r"^[\w.]+(Error|Exception|Failure)\b", line) or line.startswith("AssertionError"):
            return line[:300]
    return (lines[-1] if lines else "")[:300]


class _Collector(unittest.TestResult):
    def __init__(self, on_result: Callable[[str, str, str], None]):
        super().__init__()
        self.on_result = on_result

    def addSuccess(self, test):
        self.on_result(test, "passed", "")

    def addFailure(self, test, err):
        self.on_result(test, "failed", _first_line(self._exc_info_to_string(err, test)))

    def addError(self, test, err):
        self.on_result(test, "error", _first_line(self._exc_info_to_string(err, test)))

    def addSkip(self, test, reason):
        self.on_result(test, "skipped", reason)


def run_suite(device: str = "CPU", include: Iterable[str] = (), categories: Iterable[str] = ("node",),
              progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run the suite for `device`; `include` patterns restrict it (regular expressions over test names)."""
    import onnx.backend.test

    import kiln.onnx_backend as backend

    cats = set(categories)
    suffix = "_" + device.lower()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = onnx.backend.test.BackendTest(backend)
        ops = node_ops()
    patterns = [re.compile(p) for p in include]
    reasons = {re.compile(p): r for p, r in EXCLUDED.items()}
    outcomes: list[Outcome] = []

    def record(test, status, reason):
        name = test._testMethodName.removesuffix(suffix)
        cat = CATEGORIES.get(type(test).__name__, type(test).__name__)
        o = Outcome(name, cat, ops.get(name, cat), status, reason)
        outcomes.append(o)
        if progress:
            progress(o)

    collector = _Collector(record)
    for cls_name, cls in bt.test_cases.items():
        if CATEGORIES.get(cls_name) not in cats:
            continue
        for attr in sorted(dir(cls)):
            if not (attr.startswith("test_") and attr.endswith(suffix)):
                continue
            if patterns and not any(p.search(attr) for p in patterns):
                continue
            test = cls(attr)
            excluded = next((r for p, r in reasons.items() if p.search(attr)), None)
            if excluded:
                record(test, "excluded", excluded)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                test.run(collector)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    """`python -m kiln.conformance [PATTERN ...]`: run matching node tests, print failures and totals."""
    import argparse
    import collections

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("patterns", nargs="*", help="regular expressions over test names, e.g. test_reduce")
    ap.add_argument("--device", default="CPU")
    ap.add_argument("--all-categories", action="store_true")
    ap.add_argument("-q", "--quiet", action="store_true", help="totals only")
    args = ap.parse_args(argv)
    cats = tuple(CATEGORIES.values()) if args.all_categories else ("node",)
    outs = run_suite(args.device, args.patterns, cats)
    counts = collections.Counter(o.status for o in outs)
    if not args.quiet:
        for o in outs:
            if o.status in ("failed", "error"):
                print(f"{o.status:7s} {o.name} [{o.op}]: {o.reason}")
    print(dict(counts), "total", len(outs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
