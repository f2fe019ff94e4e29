"""Gather, scatter, selection and scan kinds against ONNX Runtime, randomized.

Indices are int32 and int64 and include negative values; ties and duplicates are exercised where
ONNX defines the outcome.
"""

import numpy as np
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("axis,ishape", [(0, (2, 3)), (1, ()), (-1, (4,))])
def test_gather(itype, axis, ishape):
    x = rand(4, 5, 3)
    idx = rng.integers(-3, 3, ishape).astype(itype)
    check_op("Gather", {"x": x, "i": idx}, {"axis": axis})


def test_gather_empty_indices():
    check_op("Gather", {"x": rand(4, 3), "i": np.zeros((0, 2), np.int64)}, {"axis": 0})


@pytest.mark.parametrize("axis", [0, -1])
def test_gather_elements(axis):
    idx = rng.integers(-3, 3, (3, 2)).astype(np.int32)
    check_op("GatherElements", {"x": rand(3, 3), "i": idx}, {"axis": axis})


@pytest.mark.parametrize("batch_dims,ishape,k", [(0, (2, 3), 2), (0, (4,), 3), (1, (2, 3), 1), (2, (2, 3, 1), 0)])
def test_gather_nd(batch_dims, ishape, k):
    x = rand(2, 3, 4)
    bounds = x.shape[batch_dims:batch_dims + k]
    idx = np.stack([rng.integers(-b, b, ishape) for b in bounds], -1) if k else np.zeros(ishape + (0,), np.int64)
    check_op("GatherND", {"x": x, "i": idx.astype(np.int64)}, {"batch_dims": batch_dims})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction):
    x = rand(3, 4)
    idx = np.array([[0, -1, 2], [1, 1, 0]], np.int64) if reduction != "none" else np.array([[0, -1, 2]], np.int64)
    upd = rand(*idx.shape)
    check_op("ScatterElements", {"x": x, "i": idx, "u": upd}, {"axis": 1, "reduction": reduction}, opset=18)


def test_scatter_v9():
    check_op("Scatter", {"x": rand(3, 3), "i": np.array([[1, 0, 2]], np.int64), "u": rand(1, 3)}, {"axis": 0},
             opset=9)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    x = rand(4, 3, 2)
    idx = np.array([[1], [-1]], np.int64) if reduction == "none" else np.array([[1, 0], [1, 0], [-4, 2]], np.int64)
    upd = rand(*idx.shape[:-1], *x.shape[idx.shape[-1]:])
    check_op("ScatterND", {"x": x, "i": idx, "u": upd}, {"reduction": reduction}, opset=18)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    idx = np.array([[0, -1, 7], [2, 9, -6]], np.int64)  # 9 and -6 are out of range: all off
    check_op("OneHot", {"i": idx}, {"axis": axis},
             constants={"depth": np.array(5, np.int64), "values": np.array([2, 5], np.float32)})


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_compress(axis):
    cond = np.array([True, False, True], bool)
    attrs = {"axis": axis} if axis is not None else {}
    check_op("Compress", {"x": rand(3, 3), "c": cond}, attrs)


def test_non_zero():
    x = rng.integers(0, 2, (3, 4)).astype(np.float32)
    check_op("NonZero", {"x": x})
    check_op("NonZero", {"x": np.zeros((2, 0), np.int32)})


@pytest.mark.parametrize("largest", [0, 1])
def test_top_k_ties_keep_input_order(largest):
    x = rng.integers(0, 3, (3, 6)).astype(np.float32)
    check_op("TopK", {"x": x, "k": np.array([4], np.int64)}, {"axis": -1, "largest": largest}, n_outputs=2)


def test_top_k_v1_attribute():
    check_op("TopK", {"x": rand(5, 3)}, {"k": 2, "axis": 0}, n_outputs=2, opset=9)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("is_sorted", [0, 1])
def test_unique(axis, is_sorted):
    x = rng.integers(0, 3, (4, 3)).astype(np.float32)
    x[2] = x[0]
    attrs = {"sorted": is_sorted} | ({"axis": axis} if axis is not None else {})
    check_op("Unique", {"x": x}, attrs, n_outputs=4)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(exclusive, reverse):
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check_op("CumSum", {"x": rand(3, 4)}, attrs, constants={"axis": np.array(-1, np.int32)})
    check_op("CumSum", {"x": rng.integers(-5, 5, (3, 4)).astype(np.int32)}, attrs,
             constants={"axis": np.array(0, np.int64)})


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod(exclusive, reverse):
    check_op("CumProd", {"x": rand(2, 5)}, {"exclusive": exclusive, "reverse": reverse},
             constants={"axis": np.array(1, np.int64)}, opset=26)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode):
    cache, update = rand(2, 3, 5, 4), rand(2, 3, 3, 4)
    at = np.array([1, 2] if mode == "linear" else [3, 4], np.int64)  # circular writes wrap around
    check_op("TensorScatter", {"cache": cache, "update": update, "at": at},
             {"mode": mode, "axis": 2} if mode == "linear" else {"mode": mode}, opset=24)
    check_op("TensorScatter", {"cache": cache, "update": update}, {"axis": -2}, opset=24)


def test_reverse_sequence():
    x = rand(4, 3, 2)
    check_op("ReverseSequence", {"x": x, "lens": np.array([4, 1, 2], np.int64)}, {"time_axis": 0, "batch_axis": 1})
    check_op("ReverseSequence", {"x": x, "lens": np.array([3, 1, 2, 0], np.int64)},
             {"time_axis": 1, "batch_axis": 0})


def test_unknown_reduction_is_unsupported():
    model = make_model("ScatterND", {"x": rand(3), "i": np.array([[0]], np.int64), "u": rand(1)}, {"reduction": "add"},
                       opset=18)
    model.graph.node[0].attribute[0].s = b"mean"
    with pytest.raises(UnsupportedOpError, match="reduction='mean'"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))


@pytest.mark.parametrize("op", ["GatherND", "ScatterND"])
def test_nd_addressing_makes_no_host_tensors(op, monkeypatch):
    """Negative indices wrap with Python ints: a host list copied to the device would break CUDA graph capture."""
    import torch

    from kiln.kinds.registry import run_reference

    x = torch.arange(24.0).reshape(2, 3, 4)
    idx = torch.tensor([[[0, -1], [1, 2]], [[-2, 0], [1, -3]]])
    inputs = [x, idx] if op == "GatherND" else [x, idx[0], torch.ones(2, 4)]
    want = run_reference(op, inputs, {})[0]

    def refuse(*a, **k):
        raise AssertionError("torch.tensor called")
    monkeypatch.setattr(torch, "tensor", refuse)
    got = run_reference(op, inputs, {})[0]
    assert torch.equal(got, want)
    if op == "GatherND":
        assert torch.equal(got, torch.stack([x[[0, 1], [-1, 2]], x[[-2, 1], [0, -3]]]))
