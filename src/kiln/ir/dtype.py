"""The element types of kiln's IR, with their numpy, torch and ONNX equivalents.

Runtime representation (what a tensor of each type is while an engine runs):

- Most types are a torch tensor of the torch dtype of the same name (fp8 variants included).
- INT4, UINT4, INT2, UINT2 are unpacked, one value per byte, held in torch's shell dtypes
  (`torch.int4` …): the byte is the value itself (sign-extended for signed types), so
  `t.view(DType.INT4.carrier)` gives an int8 tensor to compute on. Torch kernels mostly do not
  run on shell dtypes: compute on the carrier view and `view` the result back.
- FLOAT4E2M1 is one 4-bit code per byte (low nibble, high nibble zero) in a
  `torch.float4_e2m1fn_x2` tensor; its carrier is uint8 (the code).
- STRING is a numpy object array of `str`; it has no torch dtype and passes through
  `to_torch`/`to_numpy` unchanged.
- On the numpy side (user feeds and results) the narrow types are ml_dtypes arrays
  (`ml_dtypes.int4`, `float4_e2m1fn`, `float8_e4m3fnuz`, …), whose dtype names are the
  values of this enum.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np
import torch
from onnx import TensorProto

from kiln.errors import ModelError


class DType(enum.Enum):
    """One IR element type; value is the canonical lower-case name used in plans (= numpy/ml_dtypes name)."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"
    FP8E4M3 = "float8_e4m3fn"
    FP8E5M2 = "float8_e5m2"
    FP8E4M3FNUZ = "float8_e4m3fnuz"
    FP8E5M2FNUZ = "float8_e5m2fnuz"
    FP8E8M0 = "float8_e8m0fnu"
    FP4E2M1 = "float4_e2m1fn"
    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    UINT16 = "uint16"
    INT32 = "int32"
    UINT32 = "uint32"
    INT64 = "int64"
    UINT64 = "uint64"
    INT4 = "int4"
    UINT4 = "uint4"
    INT2 = "int2"
    UINT2 = "uint2"
    BOOL = "bool"
    COMPLEX64 = "complex64"
    COMPLEX128 = "complex128"
    STRING = "string"

    @property
    def torch(self) -> torch.dtype | None:
        """The runtime torch dtype (None for STRING, whose values are numpy object arrays)."""
        return _TORCH.get(self)

    @property
    def carrier(self) -> torch.dtype | None:
        """The torch dtype to compute on: int8/uint8 for the sub-byte types, else `torch` itself."""
        return _CARRIER.get(self, self.torch)

    @property
    def itemsize(self) -> int:
        """Bytes per element at run time (sub-byte types are unpacked: 1; STRING: one object pointer)."""
        return 8 if self is DType.STRING else self.torch.itemsize

    @property
    def bits(self) -> int:
        """Bits of information per element (4 for INT4 and FP4E2M1, 2 for INT2, ...)."""
        return _BITS.get(self, 8 * self.itemsize)

    @property
    def is_float(self) -> bool:
        return self.torch is not None and self.torch.is_floating_point

    @property
    def is_int(self) -> bool:
        """Integer types (not bool)."""
        return self.torch is not None and self is not DType.BOOL and not self.is_float and not self.torch.is_complex

    @property
    def int_range(self) -> tuple[int, int]:
        """(min, max) of an integer type."""
        if not self.is_int:
            raise ValueError(f"{self} is not an integer type")
        info = ml_dtypes.iinfo(self.value)
        return int(info.min), int(info.max)

    @property
    def numpy(self) -> np.dtype:
        """The numpy (or ml_dtypes) dtype of this type's values on the numpy side."""
        return np.dtype(object) if self is DType.STRING else np.dtype(getattr(ml_dtypes, self.value, self.value))

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
    def from_torch(cls, dt) -> "DType":
        """The type of a runtime value's dtype: a torch dtype, or numpy object (STRING)."""
        if isinstance(dt, np.dtype) and dt.kind in "OUS":
            return DType.STRING
        try:
            return _FROM_TORCH[dt]
        except KeyError:
            raise ModelError(f"torch dtype {dt} has no kiln equivalent") from None

    @classmethod
    def from_numpy(cls, dt) -> "DType":
        """numpy and ml_dtypes dtypes; str, bytes and object arrays are STRING."""
        dt = np.dtype(dt)
        if dt.kind in "OUS":
            return DType.STRING
        try:
            return cls(dt.name)
        except ValueError:
            raise ModelError(f"numpy dtype {dt} has no kiln equivalent") from None

    def __str__(self) -> str:
        return self.value


_D = DType
_SHELL = {_D.INT4: torch.int4, _D.UINT4: torch.uint4, _D.INT2: torch.int2, _D.UINT2: torch.uint2,
          _D.FP4E2M1: torch.float4_e2m1fn_x2}
_TORCH = {d: getattr(torch, d.value) for d in DType if d is not DType.STRING and d not in _SHELL} | _SHELL
_FROM_TORCH = {v: k for k, v in _TORCH.items()}
_CARRIER = {_D.INT4: torch.int8, _D.INT2: torch.int8, _D.UINT4: torch.uint8, _D.UINT2: torch.uint8,
            _D.FP4E2M1: torch.uint8}
_SHELL_CARRIER = {_SHELL[d]: _CARRIER[d] for d in _SHELL}
_BITS = {_D.INT4: 4, _D.UINT4: 4, _D.FP4E2M1: 4, _D.INT2: 2, _D.UINT2: 2}

_T = TensorProto
_TO_ONNX = {
    _D.FLOAT32: _T.FLOAT, _D.FLOAT16: _T.FLOAT16, _D.BFLOAT16: _T.BFLOAT16, _D.FLOAT64: _T.DOUBLE,
    _D.FP8E4M3: _T.FLOAT8E4M3FN, _D.FP8E5M2: _T.FLOAT8E5M2, _D.FP8E4M3FNUZ: _T.FLOAT8E4M3FNUZ,
    _D.FP8E5M2FNUZ: _T.FLOAT8E5M2FNUZ, _D.FP8E8M0: _T.FLOAT8E8M0, _D.FP4E2M1: _T.FLOAT4E2M1,
    _D.INT8: _T.INT8, _D.UINT8: _T.UINT8, _D.INT16: _T.INT16, _D.UINT16: _T.UINT16,
    _D.INT32: _T.INT32, _D.UINT32: _T.UINT32, _D.INT64: _T.INT64, _D.UINT64: _T.UINT64,
    _D.INT4: _T.INT4, _D.UINT4: _T.UINT4, _D.INT2: _T.INT2, _D.UINT2: _T.UINT2,
    _D.BOOL: _T.BOOL, _D.COMPLEX64: _T.COMPLEX64, _D.COMPLEX128: _T.COMPLEX128, _D.STRING: _T.STRING,
}
_FROM_ONNX = {v: k for k, v in _TO_ONNX.items()}

# Types numpy lacks natively: crossed between numpy and torch through their bits (fp8, bf16, fp4 codes)
# or, for the sub-byte integers, through their value in the carrier (ml_dtypes keeps int4 as a nibble).
_BITWISE = {_D.BFLOAT16: np.uint16, _D.FP8E4M3: np.uint8, _D.FP8E5M2: np.uint8, _D.FP8E4M3FNUZ: np.uint8,
            _D.FP8E5M2FNUZ: np.uint8, _D.FP8E8M0: np.uint8, _D.FP4E2M1: np.uint8}
_BY_VALUE = {_D.INT4: np.int8, _D.INT2: np.int8, _D.UINT4: np.uint8, _D.UINT2: np.uint8}


def to_torch(array: np.ndarray):
    """numpy (including ml_dtypes types) → CPU torch tensor owning its memory; strings stay a numpy object array."""
    array = np.asarray(array)
    if array.dtype.kind in "USO":
        return array.astype(object)  # astype copies
    dtype = DType.from_numpy(array.dtype)
    if dtype in _BITWISE:
        return torch.from_numpy(array.copy(order="C").view(_BITWISE[dtype])).view(dtype.torch)
    if dtype in _BY_VALUE:
        return torch.from_numpy(array.astype(_BY_VALUE[dtype])).view(dtype.torch)
    return torch.from_numpy(np.array(array, copy=True))


def to_numpy(tensor) -> np.ndarray:
    """Runtime value → numpy; bf16/fp8/fp4/int4/int2 become ml_dtypes arrays, strings pass through."""
    if isinstance(tensor, np.ndarray):
        return tensor
    dtype = DType.from_torch(tensor.dtype)
    if dtype in _BITWISE:
        return _cpu(tensor.view(torch.uint16 if dtype is DType.BFLOAT16 else torch.uint8)).view(dtype.numpy)
    if dtype in _BY_VALUE:
        return _cpu(tensor.view(dtype.carrier)).astype(dtype.numpy)
    return _cpu(tensor)


def shell_carrier(dtype: torch.dtype) -> torch.dtype | None:
    """The byte-sized dtype holding a torch sub-byte shell dtype's values (int4 → int8), else None."""
    return _SHELL_CARRIER.get(dtype)


def move(tensor: torch.Tensor, device, non_blocking: bool = False) -> torch.Tensor:
    """`tensor.to(device)`, also for torch's sub-byte shell dtypes, which torch can copy only as their carrier bytes."""
    carrier = _SHELL_CARRIER.get(tensor.dtype)
    if carrier is None:
        return tensor.to(device, non_blocking=non_blocking)
    return tensor.view(carrier).to(device, non_blocking=non_blocking).view(tensor.dtype)


def _cpu(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()
