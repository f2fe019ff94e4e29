"""The one list of backend tests kiln does not run, each with the reason why.

A pattern is a regular expression over the harness's test names (e.g. `test_abs_cpu`).
Never exclude a test of an op kiln supports without naming the missing feature.
"""

from __future__ import annotations

EXCLUDED: dict[str, str] = {
    # The "real" category downloads model zoo files at run time; kiln's CI has no network.
    r"^test_(bvlc_alexnet|densenet121|inception_v1|inception_v2|resnet50|shufflenet|squeezenet|vgg19|zfnet512)_":
        "model zoo test: downloads weights from the network at run time",
}
