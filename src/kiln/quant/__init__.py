"""Precision assignment: the passes that choose each layer's compute type (DESIGN.md part 4)."""

from kiln.quant.precision import apply_precision

__all__ = ["apply_precision"]
