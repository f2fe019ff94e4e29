"""ONNX's own backend test suite, unmodified, run through kiln.onnx_backend.

Every test that does not pass is listed, with its reason, in src/kiln/conformance/exclusions.py;
CUDA variants skip on machines without a GPU.
"""

import warnings

import onnx.backend.test

import kiln.onnx_backend as backend
from kiln.conformance.exclusions import EXCLUDED

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _suite = onnx.backend.test.BackendTest(backend, __name__)
for _pattern in EXCLUDED:
    _suite.exclude(_pattern)
globals().update(_suite.test_cases)
