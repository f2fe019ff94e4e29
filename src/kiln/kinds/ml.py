"""Reference implementations of the ai.onnx.ml kinds: TreeEnsemble, LabelEncoder, ArrayFeatureExtractor,
Binarizer. STRING tensors are numpy object arrays of `str` (kiln's runtime form of strings).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kiln.ir import DType
from kiln.kinds.registry import DTYPE, FLOAT, INT, INTS, STR, TENSOR, kind, list_of

_NAN = object()  # the one dictionary key of every NaN, so that NaN keys match NaN inputs


def _key(v):
    return _NAN if isinstance(v, float) and math.isnan(v) else v


@kind("LabelEncoder", attrs={"default": (FLOAT | STR).req, "dtype": DTYPE.req, "keys": list_of(FLOAT | STR).req,
                             "values": list_of(FLOAT | STR).req})
def label_encoder(inputs, attrs):
    """Map each element through keys → values; unknown elements become `default`."""
    x = inputs[0]
    table = {_key(k): v for k, v in zip(attrs["keys"], attrs["values"])}
    out = [table.get(_key(v), attrs["default"]) for v in x.reshape(-1).tolist()]
    if attrs["dtype"] is DType.STRING:
        return [np.array(out, dtype=object).reshape(x.shape)]  # a list: a bare array reads as many outputs
    return torch.tensor(out, dtype=attrs["dtype"].torch, device=getattr(x, "device", None)).reshape(x.shape)


@kind("ArrayFeatureExtractor", attrs={})
def array_feature_extractor(inputs, attrs):
    """X[..., indices] (indices flattened); a 1-D X gives one row [1, k], as ONNX Runtime does."""
    x, indices = inputs
    index = indices.reshape(-1)
    if isinstance(x, np.ndarray):
        out = x[..., index.cpu().numpy()]
    else:
        out = x.index_select(-1, index.to(x.device))
    return [out.reshape(1, -1) if x.ndim == 1 else out]


@kind("Binarizer", attrs={"threshold": FLOAT.req})
def binarizer(inputs, attrs):
    x = inputs[0]
    return (x > attrs["threshold"]).to(x.dtype)


# TreeEnsemble node modes, in ONNX's numbering: LEQ, LT, GTE, GT, EQ, NEQ, MEMBER
_COMPARE = (torch.le, torch.lt, torch.ge, torch.gt, torch.eq, torch.ne)
_MEMBER = 6


def _member_sets(attrs: dict, modes: torch.Tensor) -> torch.Tensor:
    """[nodes, m] fp64 set members of each BRANCH_MEMBER node (NaN-padded), from the NaN-delimited list."""
    flat = attrs.get("membership_values")
    flat = [] if flat is None else torch.as_tensor(flat).tolist()
    sets, current = [], []
    for v in flat:
        if math.isnan(v):
            sets.append(current)
            current = []
        else:
            current.append(v)
    width = max([len(s) for s in sets] + [1])
    out = torch.full((len(modes), width), math.nan, dtype=torch.float64)
    for node, members in zip((modes == _MEMBER).nonzero().flatten().tolist(), sets):
        out[node, :len(members)] = torch.tensor(members, dtype=torch.float64)
    return out


def _leaves(x: torch.Tensor, attrs: dict) -> torch.Tensor:
    """[N, trees] index of the leaf each sample reaches in each tree (all trees walked together)."""
    dev = x.device

    def t(name, dtype=torch.int64):
        return torch.as_tensor(attrs[name], dtype=dtype).to(dev)

    feature, modes, split = t("nodes_featureids"), t("nodes_modes"), t("nodes_splits", torch.float64)
    true_id, false_id = t("nodes_truenodeids"), t("nodes_falsenodeids")
    true_leaf, false_leaf = t("nodes_trueleafs", torch.bool), t("nodes_falseleafs", torch.bool)
    missing = attrs.get("nodes_missing_value_tracks_true")
    missing = torch.as_tensor([0] * len(modes) if missing is None else missing, dtype=torch.bool).to(dev)
    members = _member_sets(attrs, modes.cpu()).to(dev)
    roots = t("tree_roots")
    at_leaf = true_leaf[roots] & false_leaf[roots] & (true_id[roots] == false_id[roots])
    idx = torch.where(at_leaf, true_id[roots], roots).expand(x.shape[0], -1).clone()
    at_leaf = at_leaf.expand(x.shape[0], -1).clone()
    for _ in range(len(modes)):
        if bool(at_leaf.all()):
            break
        node = idx.where(~at_leaf, 0)
        v = x.gather(1, feature[node])
        s = split[node]
        tests = torch.stack([op(v, s) for op in _COMPARE] + [(v[..., None] == members[node]).any(-1)])
        go_true = tests.gather(0, modes[node][None])[0] | (missing[node] & v.isnan())
        idx = torch.where(at_leaf, idx, torch.where(go_true, true_id[node], false_id[node]))
        at_leaf = at_leaf | torch.where(go_true, true_leaf[node], false_leaf[node])
    return idx


def _post_transform(y: torch.Tensor, how: int) -> torch.Tensor:
    """NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO (zeros stay zero), PROBIT."""
    if how == 1:
        return torch.softmax(y, -1)
    if how == 2:
        return torch.sigmoid(y)
    if how == 3:
        e = torch.exp(y - y.max(-1, keepdim=True).values) * (y != 0)
        return e / e.sum(-1, keepdim=True).where(e.sum(-1, keepdim=True) > 0, 1.0)
    if how == 4:
        return math.sqrt(2) * torch.erfinv(2 * y - 1)
    return y


@kind("TreeEnsemble", attrs={"aggregate_function": INT.req, "leaf_targetids": INTS.req, "leaf_weights": TENSOR.req,
                             "membership_values": TENSOR, "n_targets": INT.req, "nodes_falseleafs": INTS,
                             "nodes_falsenodeids": INTS, "nodes_featureids": INTS, "nodes_hitrates": TENSOR,
                             "nodes_missing_value_tracks_true": INTS, "nodes_modes": TENSOR, "nodes_splits": TENSOR,
                             "nodes_trueleafs": INTS, "nodes_truenodeids": INTS, "post_transform": INT.req,
                             "tree_roots": INTS})
def tree_ensemble(inputs, attrs):
    """X [N, F] → [N, n_targets]: each tree adds its leaf's weight to the leaf's target, aggregated."""
    x = inputs[0]
    idx = _leaves(x.double(), attrs)
    weight = torch.as_tensor(attrs["leaf_weights"], dtype=torch.float64).to(x.device)[idx]
    target = torch.as_tensor(attrs["leaf_targetids"], dtype=torch.int64).to(x.device)[idx]
    out = torch.zeros(x.shape[0], attrs["n_targets"], dtype=torch.float64, device=x.device)
    agg = attrs["aggregate_function"]
    if agg in (0, 1):
        out.scatter_add_(1, target, weight)
        out = out / idx.shape[1] if agg == 0 else out
    else:
        out.scatter_reduce_(1, target, weight, "amin" if agg == 2 else "amax", include_self=False)
    return _post_transform(out, attrs["post_transform"]).to(x.dtype)
