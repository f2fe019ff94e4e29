"""A typed value of the network IR: a tensor, a sequence of tensors, or an optional.

Dimensions are ints, symbolic names, or None (unknown).
"""

from __future__ import annotations

from kiln.errors import InternalError
from kiln.ir.dtype import DType

Dim = int | str | None

# What a value is: its runtime form is a tensor, a list of tensors, or a value-or-None.
VALUE_KINDS = ("tensor", "sequence", "optional", "optional_sequence")


class Tensor:
    """A named value with one element type and a (possibly symbolic) shape.

    For sequences and optionals, `dtype` and `shape` describe the element tensor (shape None: unknown).
    """

    __slots__ = ("name", "dtype", "shape", "kind")

    def __init__(self, name: str, dtype: DType, shape: tuple[Dim, ...] | None, kind: str = "tensor"):
        if kind not in VALUE_KINDS:
            raise InternalError(f"tensor {name!r}: value kind {kind!r} is not one of {VALUE_KINDS}")
        self.name = name
        self.dtype = dtype
        self.shape = None if shape is None else tuple(shape)
        self.kind = kind

    @property
    def is_static(self) -> bool:
        """A plain tensor whose every dimension is known (sequences and optionals never are)."""
        return self.kind == "tensor" and self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def shape_str(self) -> str:
        if self.shape is None:
            return "?"
        return "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"

    def type_str(self) -> str:
        """The type as printed: float32[2,3], seq<float32[?]>, opt<float32[2]>, opt<seq<int64[]>>."""
        t = f"{self.dtype}{self.shape_str()}"
        if self.kind in ("sequence", "optional_sequence"):
            t = f"seq<{t}>"
        return f"opt<{t}>" if self.kind.startswith("optional") else t

    def __repr__(self) -> str:
        return f"{self.name}: {self.type_str()}"
