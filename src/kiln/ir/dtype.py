"""The element types of kiln's IR, with their numpy, torch and ONNX equivalents."""

from __future__ import annotations

import enum

import numpy as np
import torch
from onnx import TensorProto

from kiln.errors import ModelError


class DType(enum.Enum):
    """One IR element type; value is the canonical lower-case name used in plans."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"
    FP8E4M3 = "float8_e4m3fn"
    FP8E5M2 = "float8_e5m2"
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    UINT16 = "uint16"
    INT32 = "int32"
    UINT32 = "uint32"
    INT64 = "int64"
    UINT64 = "uint64"
    BOOL = "bool"

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.value)

    @property
    def itemsize(self) -> int:
        return self.torch.itemsize

    @property
    def is_float(self) -> bool:
        return self.torch.is_floating_point

    @property
    def onnx(self) -> int:
        return _TO_ONNX[self]

    @classmethod
    def from_onnx(cls, code: int) -> "DType":
        try:
            return _FROM_ONNX[code]
        except KeyError:
            name = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else str(code)
            raise ModelError(f"element type {name} is not supported by kiln; cast it in the model first") from None

    @classmethod
    def from_torch(cls, dt: torch.dtype) -> "DType":
        for d in cls:
            if d.torch == dt:
                return d
        raise ModelError(f"torch dtype {dt} has no kiln equivalent")

    @classmethod
    def from_numpy(cls, dt) -> "DType":
        dt = np.dtype(dt)
        name = {"float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}.get(dt.name, dt.name)
        try:
            return cls(name)
        except ValueError:
            raise ModelError(f"numpy dtype {dt} has no kiln equivalent") from None

    def __str__(self) -> str:
        return self.value


_T = TensorProto
_TO_ONNX = {
    DType.FLOAT32: _T.FLOAT, DType.FLOAT16: _T.FLOAT16, DType.BFLOAT16: _T.BFLOAT16,
    DType.FLOAT64: _T.DOUBLE, DType.FP8E4M3: _T.FLOAT8E4M3FN, DType.FP8E5M2: _T.FLOAT8E5M2,
    DType.INT8: _T.INT8, DType.UINT8: _T.UINT8, DType.INT16: _T.INT16, DType.UINT16: _T.UINT16,
    DType.INT32: _T.INT32, DType.UINT32: _T.UINT32, DType.INT64: _T.INT64, DType.UINT64: _T.UINT64,
    DType.BOOL: _T.BOOL,
}
_FROM_ONNX = {v: k for k, v in _TO_ONNX.items()}


def to_torch(array: np.ndarray) -> torch.Tensor:
    """numpy (including ml_dtypes bf16/fp8) → CPU torch tensor, copying so the result owns its memory."""
    array = np.asarray(array)
    name = array.dtype.name
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raw = torch.from_numpy(np.ascontiguousarray(array).view(np.uint16 if name == "bfloat16" else np.uint8).copy())
        return raw.view(getattr(torch, name))
    if array.dtype.kind in "USO":
        raise ModelError("string tensors are not supported by kiln")
    return torch.from_numpy(np.array(array, copy=True))


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """torch tensor → numpy; bf16/fp8 become ml_dtypes arrays."""
    t = tensor.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        import ml_dtypes

        raw = t.contiguous().view(torch.uint16 if t.dtype == torch.bfloat16 else torch.uint8).numpy()
        return raw.view(getattr(ml_dtypes, str(t.dtype).removeprefix("torch.")))
    return t.numpy()
