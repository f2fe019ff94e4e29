"""The Triton Gather kernel and the triton_gather tactic against ONNX Gather's reference: every axis, negative
indices, int32 and int64 indices, index tensors of several ranks, float and integer data, into the planned buffer;
an index out of range reads zeros. On the CPU under TRITON_INTERPRET=1."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.ir import DType  # noqa: E402
from kiln.kernels import gather  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402
from kiln.target.device import Device  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CPU = Device("cpu", "cpu", "cpu")


@pytest.mark.parametrize("shape, axis, idx_shape", [((50, 24), 0, (2, 7)), ((3, 40, 5), 1, (6,)), ((4, 6, 9), 2, ()),
                                                    ((128,), 0, (1, 128)), ((2, 1100), 0, (3,))])
@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_matches_the_reference_with_negative_indices(shape, axis, idx_shape, idx_dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    size = shape[axis]
    idx = torch.randint(-size, size, idx_shape, generator=g).to(idx_dtype)
    want = run_reference("Gather", [x, idx], {"axis": axis})[0]
    got = gather.gather(x.to(DEV), idx.to(DEV), axis)
    assert got.shape == want.shape and torch.equal(got.cpu(), want)


def test_integer_data_into_the_planned_buffer_and_out_of_range_as_zeros():
    x = torch.arange(60, dtype=torch.int64).reshape(12, 5).to(DEV)
    idx = torch.tensor([[0, -1], [11, 12]]).to(DEV)
    buf = torch.empty(4 * 5 * 8, dtype=torch.uint8, device=DEV)
    got = gather.gather(x, idx, 0, buf)
    assert got.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    assert got[0, 0].tolist() == x[0].tolist() and got[0, 1].tolist() == x[11].tolist()
    assert got[1, 0].tolist() == x[11].tolist() and got[1, 1].tolist() == [0] * 5  # 12 is out of range


def test_tactic_takes_numeric_data_and_integer_indices():
    tactic = registry.get("triton_gather")

    def spec(x_dtype, idx_dtype, x_shape=(30, 8), idx_shape=(4,)):
        return LayerSpec("g", "Gather", {"axis": 0}, (ValueSpec(x_dtype, x_shape), ValueSpec(idx_dtype, idx_shape)),
                         (ValueSpec(x_dtype, idx_shape + x_shape[1:]),))

    assert tactic.supports(spec(DType.FLOAT16, DType.INT64), CPU) is None
    assert tactic.supports(spec(DType.INT64, DType.INT32), CPU) is None
    assert "int32 / int64" in tactic.supports(spec(DType.FLOAT32, DType.FLOAT32), CPU)
    assert "numeric" in tactic.supports(spec(DType.BOOL, DType.INT64), CPU)
    x, idx = torch.randn(30, 8).to(DEV), torch.tensor([3, -2, 0, 29]).to(DEV)
    got = tactic.compile(spec(DType.FLOAT32, DType.INT64), {}, CPU)([x, idx])[0]
    assert torch.equal(got.cpu(), run_reference("Gather", [x.cpu(), idx.cpu()], {"axis": 0})[0])
