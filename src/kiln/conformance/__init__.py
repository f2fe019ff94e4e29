"""ONNX conformance: run the ONNX backend test suite through kiln and report per op."""

from kiln.conformance.suite import Outcome, run_suite

__all__ = ["Outcome", "run_suite"]
