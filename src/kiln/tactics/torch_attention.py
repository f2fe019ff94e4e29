"""Attention through torch's scaled_dot_product_attention, one tactic config per SDPA backend.

Covers the common case (no KV cache, no softcap, no sliding window, no QK output); the rest runs
the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kiln.tactics.common import float_io, rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec

_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def attention_reason(spec: LayerSpec, device) -> str | None:
    """Why an Attention layer is outside the common case SDPA (and the Triton flash attention) covers, or None."""
    a = spec.attrs
    extra = list(spec.inputs[4:]) + [o for o in spec.outputs[1:] if o.dtype is not None]
    if any(v is not None for v in extra[:3]) or any(o.dtype is not None for o in spec.outputs[1:]):
        return "KV cache, nonpad lengths or extra outputs"
    if a.get("softcap", 0) or a.get("left_window_size", -1) >= 0 or a.get("right_window_size", -1) >= 0:
        return "softcap or sliding window"
    if a.get("softmax_precision") not in (None,) and str(a["softmax_precision"]) != "float32":
        return "softmax precision other than the input's or fp32"
    if rank(spec.inputs[0]) != 4:
        return "only 4-D (B, H, S, D) inputs"
    mask = spec.inputs[3] if len(spec.inputs) > 3 else None
    if mask is not None and (mask.shape is None or spec.inputs[1].shape is None
                             or mask.shape[-1] != spec.inputs[1].shape[2]):
        return "mask shorter than the key length"
    io = [spec.inputs[0], spec.inputs[1], spec.inputs[2], spec.outputs[0]]
    if len({v.dtype for v in io}) != 1:
        return "Q, K, V and Y dtypes differ"
    return float_io(LayerSpec(spec.name, spec.kind, {}, tuple(io[:3]), (io[3],)))


def sdpa_configs(spec: LayerSpec, device, level: int) -> list[dict]:
    """The backends that take the dtype (flash and cuDNN: fp16 and bf16 only); the first is the untimed choice."""
    half = spec.inputs[0].dtype.torch in (torch.float16, torch.bfloat16)
    return [{"backend": b} for b in _BACKENDS if half or b in ("efficient", "math")]


def sdpa(config: dict, q, k, v, **kw):
    """SDPA on the config's backend, else math: a backend's limits depend on shapes (cuDNN refuses sequence
    length 1, efficient attention a key whose rows are not 16-byte aligned, as a transposed Kᵀ of length 1), so
    a shape of the profile's range the tuned backend cannot take runs math instead of failing."""
    backends = list(dict.fromkeys([_BACKENDS[config["backend"]], SDPBackend.MATH]))
    try:
        with sdpa_kernel(backends, set_priority=True):  # backends refusing the shape at selection
            return F.scaled_dot_product_attention(q, k, v, **kw)
    except RuntimeError:  # ... or only at launch (efficient attention's alignment checks)
        if len(backends) == 1:
            raise
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _compile(spec: LayerSpec, config, device):
    a = spec.attrs
    causal, scale = bool(a.get("is_causal")), a.get("scale")
    gqa = spec.inputs[0].shape[1] != spec.inputs[1].shape[1]

    def run(inputs):
        q, k, v = inputs[:3]
        mask = inputs[3] if len(inputs) > 3 else None
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        return [sdpa(config, q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale,
                     enable_gqa=gqa)]

    return run


def _supports_all(spec: LayerSpec, device) -> str | None:
    reason = attention_reason(spec, device)
    if reason is None and spec.attrs.get("is_causal") and len(spec.inputs) > 3 and spec.inputs[3] is not None:
        return "is_causal together with a mask"
    return reason


register(Tactic("sdpa", ("Attention",), _compile, _supports_all, sdpa_configs, priority=10, fresh=True))
