"""ai.onnx.ml kinds (TreeEnsemble, LabelEncoder, ArrayFeatureExtractor, Binarizer) against ONNX Runtime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.errors import ModelError, UnsupportedOpError
from opcheck import DEVICE, ORT_IR, run_both

rng = np.random.default_rng(0)
ML = "ai.onnx.ml"


def ml_model(op, x: np.ndarray, attrs, out_type, ml_opset, extra=None, out_rank=None):
    """One ai.onnx.ml node on graph input `x` (plus constant inputs `extra`), output typed `out_type`
    (of rank `out_rank`, default x's rank)."""
    extra = extra or {}
    node = helper.make_node(op, ["x", *extra], ["y"], domain=ML, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info("y", out_type, [f"d{i}" for i in range(out_rank or x.ndim)])],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in extra.items()])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(ML, ml_opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ORT_IR)


def check(model, x, rtol=1e-5, atol=1e-6, ort_model=None):
    """kiln on `model` against ONNX Runtime on `ort_model` (default: the same model)."""
    want, got = run_both(model, {"x": x})
    if ort_model is not None:
        want = ort.InferenceSession(ort_model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
    if want[0].dtype.kind == "f":
        np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got[0], want[0])


def build(model):
    return kiln.build(model, kiln.BuildConfig(device=DEVICE))


def forest(n_trees=3, depth=3, features=4, targets=3, modes=range(6), dtype=np.float32):
    """Random complete binary trees: interior nodes then leaves, node ids global across trees."""
    nodes = {k: [] for k in ("featureids", "modes", "splits", "truenodeids", "falsenodeids", "trueleafs",
                             "falseleafs", "missing")}
    leaf_w, leaf_t, roots = [], [], []
    for _ in range(n_trees):
        base, leaf_base, interior = len(nodes["modes"]), len(leaf_w), 2 ** depth - 1
        roots.append(base)
        for i in range(interior):
            kids = (2 * i + 1, 2 * i + 2)
            last = kids[0] >= interior
            nodes["featureids"].append(int(rng.integers(features)))
            nodes["modes"].append(int(rng.choice(list(modes))))
            nodes["splits"].append(float(rng.standard_normal()))
            nodes["trueleafs"].append(int(last))
            nodes["falseleafs"].append(int(last))
            ids = [k - interior + leaf_base if last else k + base for k in kids]
            nodes["truenodeids"].append(ids[0])
            nodes["falsenodeids"].append(ids[1])
            nodes["missing"].append(int(rng.integers(2)))
        leaf_w += rng.uniform(0.01, 0.3, 2 ** depth).tolist()  # sums of up to 3 stay in (0, 1) for PROBIT
        leaf_t += rng.integers(targets, size=2 ** depth).tolist()
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return {f"nodes_{k}": v for k, v in nodes.items() if k not in ("modes", "splits", "missing")} | {
        "nodes_modes": helper.make_tensor("m", TensorProto.UINT8, [len(nodes["modes"])], nodes["modes"]),
        "nodes_splits": helper.make_tensor("s", t, [len(nodes["splits"])], nodes["splits"]),
        "nodes_missing_value_tracks_true": nodes["missing"],
        "leaf_weights": helper.make_tensor("w", t, [len(leaf_w)], leaf_w),
        "leaf_targetids": leaf_t, "tree_roots": roots, "n_targets": targets}


# ONNX Runtime's TreeEnsemble reads post_transform 1 as LOGISTIC and 2 as SOFTMAX, the reverse of the ONNX spec
ORT_POST = {1: 2, 2: 1}


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
@pytest.mark.parametrize("post", [0, 1, 2, 3, 4])
def test_tree_ensemble(aggregate, post):
    x = rng.standard_normal((16, 4)).astype(np.float32)
    x[3, 1] = np.nan  # follows nodes_missing_value_tracks_true
    attrs = forest() | {"aggregate_function": aggregate}
    model = ml_model("TreeEnsemble", x, attrs | {"post_transform": post}, TensorProto.FLOAT, 5)
    ort_model = ml_model("TreeEnsemble", x, attrs | {"post_transform": ORT_POST.get(post, post)}, TensorProto.FLOAT, 5)
    # PROBIT: ONNX Runtime approximates erfinv to about 2e-4 relative
    check(model, x, rtol=1e-3 if post == 4 else 1e-5, ort_model=ort_model)


def test_tree_ensemble_double_and_single_leaf_tree():
    x = rng.standard_normal((8, 4))
    attrs = forest(n_trees=2, depth=2, dtype=np.float64)
    # a third tree that is one leaf: a node whose two branches are the same leaf
    n = len(attrs["nodes_featureids"])
    leaves = len(attrs["leaf_targetids"])
    for k, v in (("featureids", 0), ("truenodeids", leaves), ("falsenodeids", leaves), ("trueleafs", 1),
                 ("falseleafs", 1), ("missing_value_tracks_true", 0)):
        attrs[f"nodes_{k}"] = attrs[f"nodes_{k}"] + [v]
    attrs["nodes_modes"] = helper.make_tensor("m", TensorProto.UINT8, [n + 1],
                                              list(attrs["nodes_modes"].int32_data) + [0])
    attrs["nodes_splits"] = helper.make_tensor("s", TensorProto.DOUBLE, [n + 1],
                                               list(attrs["nodes_splits"].double_data) + [0.0])
    attrs["leaf_weights"] = helper.make_tensor("w", TensorProto.DOUBLE, [leaves + 1],
                                               list(attrs["leaf_weights"].double_data) + [7.0])
    attrs["leaf_targetids"] = attrs["leaf_targetids"] + [1]
    attrs["tree_roots"] = attrs["tree_roots"] + [n]
    check(ml_model("TreeEnsemble", x, attrs, TensorProto.DOUBLE, 5), x)


def test_tree_ensemble_set_membership():
    x = rng.integers(0, 6, (20, 2)).astype(np.float32)
    attrs = {"nodes_featureids": [0, 1], "nodes_modes": helper.make_tensor("m", TensorProto.UINT8, [2], [6, 6]),
             "nodes_splits": helper.make_tensor("s", TensorProto.FLOAT, [2], [0, 0]),
             "membership_values": helper.make_tensor("v", TensorProto.FLOAT, [6], [1, 3, np.nan, 0, 2, np.nan]),
             "nodes_truenodeids": [1, 0], "nodes_falsenodeids": [2, 1], "nodes_trueleafs": [0, 1],
             "nodes_falseleafs": [1, 1], "leaf_weights": helper.make_tensor("w", TensorProto.FLOAT, [3], [1, 10, 100]),
             "leaf_targetids": [0, 1, 0], "tree_roots": [0], "n_targets": 2}
    check(ml_model("TreeEnsemble", x, attrs, TensorProto.FLOAT, 5), x)


def test_tree_ensemble_rejects_unknown_aggregate():
    x = rng.standard_normal((2, 4)).astype(np.float32)
    with pytest.raises(UnsupportedOpError, match="aggregate_function 7"):
        build(ml_model("TreeEnsemble", x, forest() | {"aggregate_function": 7}, TensorProto.FLOAT, 5))


WORDS = np.array(["ant", "bee", "cat", "dog", "eel", "fox"], dtype=object)


@pytest.mark.parametrize("attrs, out", [
    ({"keys_strings": ["ant", "cat", "fox"], "values_int64s": [3, 1, 2]}, TensorProto.INT64),
    ({"keys_strings": ["ant", "cat"], "values_floats": [0.5, 1.5], "default_float": 9.0}, TensorProto.FLOAT),
    ({"keys_strings": ["ant", "bee"], "values_strings": ["A", "B"], "default_string": "?"}, TensorProto.STRING),
])
def test_label_encoder_from_strings(attrs, out):
    x = WORDS[rng.integers(0, 6, (3, 5))]
    check(ml_model("LabelEncoder", x, attrs, out, 2), x)


def test_label_encoder_tensors_and_nan_keys():
    """ONNX Runtime lacks float → int32 tensor mappings: checked against the spec's expected values."""
    x = np.array([0.5, np.nan, 2.0, 7.0, -1.0], np.float32)
    attrs = {"keys_tensor": helper.make_tensor("k", TensorProto.FLOAT, [3], [0.5, np.nan, 2.0]),
             "values_tensor": helper.make_tensor("v", TensorProto.INT32, [3], [10, 20, 30]),
             "default_tensor": helper.make_tensor("d", TensorProto.INT32, [1], [-5])}
    y = build(ml_model("LabelEncoder", x, attrs, TensorProto.INT32, 4)).create_context().run({"x": x})["y"]
    np.testing.assert_array_equal(y, np.array([10, 20, 30, -5, -5], np.int32))


def test_label_encoder_string_tensor_keys():
    x = WORDS[rng.integers(0, 6, (2, 4))]
    attrs = {"keys_tensor": helper.make_tensor("k", TensorProto.STRING, [2], [b"ant", b"eel"]),
             "values_tensor": helper.make_tensor("v", TensorProto.INT16, [2], [4, 5]),
             "default_tensor": helper.make_tensor("d", TensorProto.INT16, [1], [-9])}
    check(ml_model("LabelEncoder", x, attrs, TensorProto.INT16, 4), x)


def test_label_encoder_opset1_ints_to_strings():
    x = np.array([[0, 2, 5], [1, 1, 0]], np.int64)
    attrs = {"classes_strings": ["zero", "one", "two"], "default_string": "none"}
    check(ml_model("LabelEncoder", x, attrs, TensorProto.STRING, 1), x)


def test_label_encoder_rejects_mismatched_lengths():
    x = np.array([1, 2], np.int64)
    with pytest.raises(ModelError, match="2 keys but 1 values"):
        build(ml_model("LabelEncoder", x, {"keys_int64s": [1, 2], "values_int64s": [1]}, TensorProto.INT64, 2))


@pytest.mark.parametrize("shape, idx", [((3, 5), [4, 0, 4]), ((2, 3, 6), [1]), ((6,), [5, 2])])
def test_array_feature_extractor(shape, idx):
    x = rng.standard_normal(shape).astype(np.float32)
    model = ml_model("ArrayFeatureExtractor", x, {}, TensorProto.FLOAT, 1, {"i": np.array(idx, np.int64)},
                     max(len(shape), 2))
    check(model, x)


def test_binarizer():
    x = rng.standard_normal((4, 5)).astype(np.float32)
    check(ml_model("Binarizer", x, {"threshold": 0.25}, TensorProto.FLOAT, 1), x)
