"""The ordered list of passes a default build runs (each pass lives in its own module)."""

from __future__ import annotations

from kiln.passes.eliminate_dead import eliminate_dead
from kiln.passes.eliminate_identity import eliminate_identity
from kiln.passes.fold_batchnorm import fold_batchnorm
from kiln.passes.fold_constants import fold_constants
from kiln.passes.fold_shape_arithmetic import fold_shape_arithmetic

DEFAULT: list = [eliminate_identity, fold_shape_arithmetic, fold_constants, fold_batchnorm, eliminate_dead]
