"""Gather through the Triton kernel (kernels/gather.py): one launch where the reference takes four (negative
indices wrapped, then index_select); indices int32 or int64, data of a numeric dtype, any axis."""

from __future__ import annotations

from kiln.ir import DType
from kiln.kernels import gather
from kiln.kinds.shape import axis_of
from kiln.tactics.common import first, rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

DATA = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.INT64, DType.INT32, DType.INT8, DType.UINT8)


def _supports(spec: LayerSpec, device) -> str | None:
    x, idx = spec.inputs[:2]
    if rank(x) in (None, 0) or rank(idx) is None:
        return "data or index rank unknown"
    if idx.dtype not in (DType.INT64, DType.INT32):
        return "indices are not int32 / int64"
    if x.dtype not in DATA or spec.outputs[0].dtype is not x.dtype:
        return f"data of {x.dtype} (numeric dtypes only)"
    return None


def _compile(spec: LayerSpec, config, device):
    axis = axis_of(spec.attrs.get("axis", 0), rank(spec.inputs[0]))

    def run(inputs, out=None):
        return [gather.gather(inputs[0], inputs[1], axis, first(out))]

    return run


register(Tactic("triton_gather", ("Gather",), _compile, _supports, priority=20, writes_out=True))
