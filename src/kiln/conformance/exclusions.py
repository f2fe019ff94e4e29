"""The one list of backend tests kiln does not run, each with the reason why.

A pattern is a regular expression over the harness's test names (e.g. `test_abs_cpu`).
Never exclude a test of an op kiln supports without naming the missing feature.
"""

from __future__ import annotations

EXCLUDED: dict[str, str] = {
}
