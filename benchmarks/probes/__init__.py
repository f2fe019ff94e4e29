"""GPU probes: one question each about kiln's kernels or engines on a real device, answered with a JSON result.

Run from the repository root: `python -m benchmarks.probes.NAME --out FILE_OR_DIR` (see `harness.py`).
"""
