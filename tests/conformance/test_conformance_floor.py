"""The conformance floor: the number of ONNX node tests kiln passes on the CPU may only go up.

Raise FLOOR when support grows (`python -m kiln.conformance -q` prints the count).
"""

import collections

from kiln.conformance import run_suite
from kiln.conformance.table import render
from kiln.conformance.tensorrt_ops import TENSORRT_10_15

FLOOR = 1854


def test_node_tests_passing_do_not_drop_below_floor():
    outcomes = run_suite("CPU", categories=("node",))
    counts = collections.Counter(o.status for o in outcomes)
    assert len(outcomes) >= 1884, "the installed onnx generates fewer node tests than expected"
    assert counts["passed"] >= FLOOR, f"{counts['passed']} node tests pass, below the floor of {FLOOR}: {counts}"
    table = render(outcomes, "CPU")
    assert f"**Node tests: {counts['passed']} of {len(outcomes)} pass**" in table


def test_every_tensorrt_op_has_an_importer():
    from kiln.frontend.onnx.registry import IMPORTERS

    ours = {op for (domain, op) in IMPORTERS if domain == ""}
    missing = sorted(TENSORRT_10_15 - ours)
    assert not missing, f"ops TensorRT 10.15 supports that kiln does not: {missing}"
