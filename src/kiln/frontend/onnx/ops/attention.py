"""ONNX importers for the attention op family."""

from __future__ import annotations

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, direct, register, register_direct, schema_defaults
from kiln.ir import DType

_SOFTMAX_PRECISIONS = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16, as the spec lists them


def _attrs(node: OnnxNode) -> dict:
    attrs = schema_defaults(node)
    attrs.update(node.attrs)
    return attrs


def _input(node: OnnxNode, i: int) -> str:
    return node.inputs[i] if i < len(node.inputs) else ""


def _shape(ctx: ImportContext, name: str) -> tuple:
    """The tensor's shape as far as import knows it (() when unknown)."""
    t = ctx.network.tensors.get(name)
    return () if t is None or t.shape is None else t.shape


@register("Attention", since=23)
def attention(node: OnnxNode, ctx: ImportContext) -> None:
    a = _attrs(node)
    mode = a.get("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise UnsupportedOpError(f"{node.where()}: qk_matmul_output_mode={mode} is not one of 0, 1, 2, 3")
    precision = a.get("softmax_precision")
    if precision is not None and precision not in _SOFTMAX_PRECISIONS:
        raise UnsupportedOpError(f"{node.where()}: softmax_precision={precision} is not supported; use 1 (float), "
                                 "10 (float16), 11 (double) or 16 (bfloat16)")
    if bool(_input(node, 4)) != bool(_input(node, 5)):
        raise ModelError(f"{node.where()}: past_key and past_value must be given together")
    if _input(node, 6) and _input(node, 4):
        raise ModelError(f"{node.where()}: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    windows = {w: a.get(w, -1) for w in ("left_window_size", "right_window_size")}
    if min(windows.values()) < -1:
        raise ModelError(f"{node.where()}: window sizes must be -1 (unbounded) or >= 0, got {windows}")
    q_shape, k_shape = _shape(ctx, node.inputs[0]), _shape(ctx, node.inputs[1])
    heads = (a.get("q_num_heads"), a.get("kv_num_heads"))
    if len(q_shape) == 3 and None in heads:
        raise ModelError(f"{node.where()}: 3-D Q/K/V need the q_num_heads and kv_num_heads attributes")
    if len(q_shape) == 4 and len(k_shape) == 4:
        heads = (q_shape[1], k_shape[1])
    if all(isinstance(h, int) and h > 0 for h in heads) and heads[0] % heads[1]:
        raise ModelError(f"{node.where()}: {heads[0]} query heads cannot be grouped over {heads[1]} key/value heads")
    attrs = {
        "scale": a.get("scale"), "is_causal": bool(a.get("is_causal", 0)), "softcap": float(a.get("softcap", 0.0)),
        "q_num_heads": a.get("q_num_heads"), "kv_num_heads": a.get("kv_num_heads"),
        "softmax_precision": None if precision is None else DType.from_onnx(precision),
        "qk_matmul_output_mode": mode, **windows,
    }
    ctx.emit(node, "Attention", node.inputs, node.outputs, attrs)


@register("RotaryEmbedding", since=23)
def rotary_embedding(node: OnnxNode, ctx: ImportContext) -> None:
    layer = direct("RotaryEmbedding", node, ctx)
    if len(_shape(ctx, node.inputs[0])) == 3 and not layer.attrs.get("num_heads"):
        raise ModelError(f"{node.where()}: a 3-D input needs the num_heads attribute")
    layer.attrs.setdefault("num_heads", None)


@register("LinearAttention", since=27)
def linear_attention(node: OnnxNode, ctx: ImportContext) -> None:
    a = _attrs(node)
    hq, hkv, rule = a.get("q_num_heads"), a.get("kv_num_heads"), a["update_rule"]
    if not hq or not hkv or hq % hkv:
        raise ModelError(f"{node.where()}: q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise UnsupportedOpError(f"{node.where()}: update_rule {rule!r} is not one of linear, gated, delta, "
                                 "gated_delta")
    for i, what, needed in ((4, "decay", rule in ("gated", "gated_delta")),
                            (5, "beta", rule in ("delta", "gated_delta"))):
        if bool(_input(node, i)) != needed:
            raise ModelError(f"{node.where()}: update_rule {rule!r} {'requires' if needed else 'forbids'} "
                             f"the {what} input")
    ctx.emit(node, "LinearAttention", node.inputs, node.outputs,
             {"q_num_heads": hq, "kv_num_heads": hkv, "scale": float(a["scale"]), "update_rule": rule})


@register("CausalConvWithState", since=27)
def causal_conv_with_state(node: OnnxNode, ctx: ImportContext) -> None:
    layer = direct("CausalConvWithState", node, ctx)
    if layer.attrs["activation"] not in ("none", "silu", "swish"):
        raise UnsupportedOpError(f"{node.where()}: activation {layer.attrs['activation']!r} is not one of "
                                 "none, silu, swish")


register_direct("SwiGLU", since=28)
