"""Layer kinds, one module per op family; importing this package registers them all."""

from kiln.kinds import (  # noqa: F401  (imported for their registrations)
    activation,
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
from kiln.kinds.registry import KINDS, LayerKind, get, kind, run_reference

__all__ = ["KINDS", "LayerKind", "get", "kind", "run_reference"]
