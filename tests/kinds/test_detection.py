"""NonMaxSuppression against ONNX Runtime on random overlapping boxes."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, make_model, run_both

rng = np.random.default_rng(0)


def boxes(batches, n, center):
    """Random boxes on a 10x10 field, many overlapping; corners in either order unless center format."""
    a, b = rng.uniform(0, 10, (batches, n, 2)), rng.uniform(0, 10, (batches, n, 2))
    if center:
        return np.concatenate([a, rng.uniform(0.5, 4, (batches, n, 2))], -1).astype(np.float32)
    return np.concatenate([a, b], -1).astype(np.float32)


def nms(feeds, constants, attrs=None, order=None):
    model = make_model("NonMaxSuppression", feeds, attrs, constants=constants, opset=11, input_order=order)
    out = model.graph.output[0]
    out.CopyFrom(helper.make_tensor_value_info(out.name, TensorProto.INT64, ["k", 3]))
    want, got = run_both(model, feeds)
    assert got[0].dtype == np.int64 and got[0].shape[1:] == (3,)
    np.testing.assert_array_equal(got[0], want[0])
    return got[0]


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("score_threshold", [None, 0.3])
def test_nms(center, score_threshold):
    feeds = {"boxes": boxes(2, 12, center), "scores": rng.uniform(0, 1, (2, 3, 12)).astype(np.float32)}
    constants = {"max": np.array([4], np.int64), "iou": np.array([0.2], np.float32)}
    if score_threshold is not None:
        constants["score"] = np.array([score_threshold], np.float32)
    selected = nms(feeds, constants, {"center_point_box": center})
    assert len(selected) > 0


def test_nms_tied_scores_keep_lower_index():
    feeds = {"boxes": boxes(1, 8, 0), "scores": np.full((1, 1, 8), 0.5, np.float32)}
    nms(feeds, {"max": np.array([8], np.int64), "iou": np.array([0.1], np.float32)})


def test_nms_without_max_selects_nothing():
    feeds = {"boxes": boxes(1, 5, 0), "scores": rng.uniform(0, 1, (1, 1, 5)).astype(np.float32)}
    assert nms(feeds, {}).shape == (0, 3)


def test_nms_rejects_bad_center_point_box():
    feeds = {"boxes": boxes(1, 5, 0), "scores": rng.uniform(0, 1, (1, 1, 5)).astype(np.float32)}
    model = make_model("NonMaxSuppression", feeds, {"center_point_box": 2}, opset=11)
    with pytest.raises(UnsupportedOpError, match="center_point_box"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))
