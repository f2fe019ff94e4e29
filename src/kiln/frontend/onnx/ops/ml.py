"""ONNX importers for the ai.onnx.ml ops: TreeEnsemble, LabelEncoder, ArrayFeatureExtractor, Binarizer."""

from __future__ import annotations

import numpy as np
import torch

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, dtype_of, register, schema_defaults
from kiln.ir import DType

ML = "ai.onnx.ml"


def _plain(value) -> list:
    """An attribute list or tensor (numeric, or string bytes as a numpy object array) → a Python list."""
    if isinstance(value, np.ndarray):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value.reshape(-1).tolist()]
    return value.reshape(-1).tolist() if isinstance(value, torch.Tensor) else list(value)


def _tensor_dtype(value) -> DType:
    return DType.STRING if isinstance(value, np.ndarray) else DType.from_torch(value.dtype)


_LIST_TYPES = {"strings": DType.STRING, "int64s": DType.INT64, "floats": DType.FLOAT32}


def _mapping(node: OnnxNode, prefix: str) -> tuple[list, DType]:
    """The one set `keys_*` or `values_*` attribute as (list, element type)."""
    found = [(k, v) for k, v in node.attrs.items() if k.startswith(prefix + "_")]
    if len(found) != 1:
        raise ModelError(f"{node.where()}: exactly one {prefix}_* attribute must be set, got "
                         f"{sorted(k for k, _ in found) or 'none'}")
    name, value = found[0]
    suffix = name.removeprefix(prefix + "_")
    return _plain(value), _tensor_dtype(value) if suffix == "tensor" else _LIST_TYPES[suffix]


def _default(node: OnnxNode, value_type: DType):
    """The value of unknown keys: default_tensor goes with values_tensor, default_<type> with values_<type>;
    unset, it is "_Unused" for strings, -1 for integers and -0.0 for floats (the schema's defaults)."""
    fallback = "_Unused" if value_type is DType.STRING else -1 if value_type.is_int else -0.0
    if "values_tensor" in node.attrs:
        given = node.attrs.get("default_tensor")
        return fallback if given is None else _plain(given)[0]
    name = {DType.STRING: "default_string", DType.INT64: "default_int64"}.get(value_type, "default_float")
    return node.attrs.get(name, fallback)


@register("LabelEncoder", since=2, domain=ML)
def label_encoder(node: OnnxNode, ctx: ImportContext) -> None:
    keys, _ = _mapping(node, "keys")  # ONNX inference has checked that the keys' type is the input's
    values, value_type = _mapping(node, "values")
    if len(keys) != len(values):
        raise ModelError(f"{node.where()}: {len(keys)} keys but {len(values)} values")
    default = _default(node, value_type)
    attrs = {"keys": keys, "values": values, "default": default, "dtype": value_type}
    ctx.emit(node, "LabelEncoder", node.inputs, node.outputs, attrs)


@register("LabelEncoder", since=1, domain=ML)
def label_encoder_1(node: OnnxNode, ctx: ImportContext) -> None:
    """Opset 1: strings → their index in classes_strings, or int64 indices → those strings."""
    attrs = schema_defaults(node) | node.attrs
    classes = attrs.get("classes_strings", [])
    positions = list(range(len(classes)))
    if dtype_of(ctx, node.inputs[0]) is DType.STRING:
        attrs = {"keys": classes, "values": positions, "default": attrs["default_int64"], "dtype": DType.INT64}
    else:
        attrs = {"keys": positions, "values": classes, "default": attrs["default_string"], "dtype": DType.STRING}
    ctx.emit(node, "LabelEncoder", node.inputs, node.outputs, attrs)


register("ArrayFeatureExtractor", since=1, domain=ML)(lambda node, ctx: direct("ArrayFeatureExtractor", node, ctx))
register("Binarizer", since=1, domain=ML)(lambda node, ctx: direct("Binarizer", node, ctx))


_NODE_ATTRS = ("nodes_featureids", "nodes_modes", "nodes_splits", "nodes_truenodeids", "nodes_falsenodeids",
               "nodes_trueleafs", "nodes_falseleafs")


@register("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(node: OnnxNode, ctx: ImportContext) -> None:
    attrs = schema_defaults(node) | node.attrs
    if attrs["aggregate_function"] not in range(4) or attrs["post_transform"] not in range(5):
        raise UnsupportedOpError(f"{node.where()}: aggregate_function {attrs['aggregate_function']} or "
                                 f"post_transform {attrs['post_transform']} is not an ONNX value")
    missing = [a for a in _NODE_ATTRS + ("leaf_targetids", "leaf_weights", "tree_roots", "n_targets")
               if a not in attrs]
    if missing:
        raise ModelError(f"{node.where()}: required attributes {missing} are missing")
    sizes = {a: len(_plain(attrs[a])) for a in _NODE_ATTRS}
    if len(set(sizes.values())) != 1:
        raise ModelError(f"{node.where()}: the nodes_* attributes differ in length: {sizes}")
    if not set(_plain(attrs["nodes_modes"])) <= set(range(7)):
        raise UnsupportedOpError(f"{node.where()}: nodes_modes holds values outside 0..6")
    attrs.pop("nodes_hitrates", None)
    ctx.emit(node, "TreeEnsemble", node.inputs, node.outputs, attrs)
