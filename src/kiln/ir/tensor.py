"""A typed tensor of the network IR; dimensions are ints, symbolic names, or None (unknown)."""

from __future__ import annotations

from kiln.ir.dtype import DType

Dim = int | str | None


class Tensor:
    """A named value with one element type and a (possibly symbolic) shape."""

    __slots__ = ("name", "dtype", "shape")

    def __init__(self, name: str, dtype: DType, shape: tuple[Dim, ...] | None):
        self.name = name
        self.dtype = dtype
        self.shape = None if shape is None else tuple(shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def shape_str(self) -> str:
        if self.shape is None:
            return "?"
        return "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"

    def __repr__(self) -> str:
        return f"{self.name}: {self.dtype}{self.shape_str()}"
