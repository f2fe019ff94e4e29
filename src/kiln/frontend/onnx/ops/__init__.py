"""ONNX importers, one module per op family; importing this package registers them all."""

from kiln.frontend.onnx.ops import (  # noqa: F401  (imported for their registrations)
    activation,
    constant,
    conv,
    elementwise,
    matmul,
    misc,
    normalization,
    pool,
    quantize,
    reduce,
    shape,
)
