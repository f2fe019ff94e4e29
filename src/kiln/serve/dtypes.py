"""KServe v2 datatype names ↔ numpy dtypes, and Triton model-config type names."""

from __future__ import annotations

import functools

import numpy as np
import torch

from kiln.serve.errors import BadRequest

V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
NUMPY_TO_V2: dict[np.dtype, str] = {v: k for k, v in V2_TO_NUMPY.items()}


def numpy_to_v2(dtype) -> str:
    """The v2 datatype name of a numpy dtype (str/bytes/object → BYTES); BadRequest for others."""
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "BYTES"
    if dt not in NUMPY_TO_V2:
        raise BadRequest(f"dtype {dt} has no KServe v2 datatype; use one of {sorted(V2_TO_NUMPY)}")
    return NUMPY_TO_V2[dt]


def v2_to_numpy(name: str) -> np.dtype:
    """The numpy dtype of a v2 datatype name (also accepts Triton's TYPE_ form); BadRequest for unknown ones."""
    key = to_v2(name)
    if key not in V2_TO_NUMPY:
        raise BadRequest(f"unknown datatype {name!r}; expected one of {sorted(V2_TO_NUMPY)}")
    return V2_TO_NUMPY[key]


def to_v2(name: str) -> str:
    """A v2 datatype name from either form: "FP32" or Triton's config "TYPE_FP32" ("TYPE_STRING" → BYTES)."""
    key = name.upper().removeprefix("TYPE_")
    return "BYTES" if key == "STRING" else key


def v2_to_config(name: str) -> str:
    """Triton's model-config type name of a v2 datatype: FP32 → TYPE_FP32, BYTES → TYPE_STRING."""
    key = to_v2(name)
    return "TYPE_STRING" if key == "BYTES" else f"TYPE_{key}"


@functools.cache
def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numeric numpy dtype (as torch.from_numpy maps it)."""
    return torch.from_numpy(np.empty(0, dtype)).dtype
