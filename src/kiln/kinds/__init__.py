"""Layer kinds, one module per op family; importing this package registers them all."""

from kiln.kinds import (  # noqa: F401  (imported for their registrations)
    activation,
    attention,
    cast,
    controlflow,
    conv,
    detection,
    elementwise,
    fused,
    indexing,
    linalg,
    loss,
    matmul,
    misc,
    ml,
    normalization,
    pool,
    quantize,
    quantized,
    reduce,
    resize,
    rnn,
    sampling,
    sequence,
    shape,
    softmax,
    spectral,
    strings,
    text,
    training,
)
from kiln.kinds.registry import KINDS, LayerKind, get, kind, run_reference

__all__ = ["KINDS", "LayerKind", "get", "kind", "run_reference"]
