"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against ONNX Runtime: every reduction,
class weights, ignore_index (also outside the class range), extra dims and the log_prob output."""

import numpy as np
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)
OPS = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]


def _case(shape, ignore=None):
    """Scores [N, C, ...] and int64 targets [N, ...], a few of them set to `ignore`."""
    x = rng.standard_normal(shape).astype(np.float32)
    target = rng.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    if ignore is not None:
        target.reshape(-1)[::3] = ignore
    return x, target


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_reductions(op, reduction, weighted):
    x, target = _case((4, 5))
    weight = {"w": rng.uniform(0.2, 2, 5).astype(np.float32)} if weighted else {}
    check_op(op, {"x": x, "t": target}, {"reduction": reduction}, constants=weight)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("ignore", [1, -1, 10])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_ignore_index_with_extra_dims(op, ignore, reduction):
    x, target = _case((2, 4, 3, 2), ignore)
    check_op(op, {"x": x, "t": target, "w": rng.uniform(0.2, 2, 4).astype(np.float32)},
             {"reduction": reduction, "ignore_index": ignore})


def test_ignore_index_unweighted_mean_counts_kept_targets():
    x, target = _case((6, 3, 2), 0)
    check_op("NegativeLogLikelihoodLoss", {"x": x, "t": target}, {"ignore_index": 0})


def test_sce_log_prob_output():
    x, target = _case((3, 4, 5))
    check_op("SoftmaxCrossEntropyLoss", {"x": x, "t": target}, {"reduction": "sum"}, n_outputs=2)


@pytest.mark.parametrize("op", OPS)
def test_rejects_unknown_reduction(op):
    x, target = _case((2, 3))
    model = make_model(op, {"x": x, "t": target}, {"reduction": "max"})
    with pytest.raises(UnsupportedOpError, match="reduction='max'"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))
