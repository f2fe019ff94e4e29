"""Attention and FusedAttention through the generated Triton flash-attention kernel (kernels/attention.py).

Attention: the layers SDPA takes (4-D, no KV cache, softcap or window), and also causal together
with a mask. FusedAttention (kinds/fused.py): 3-D or 4-D Q, KT, V and an additive or keep mask; a row whose
mask is all -inf gives zeros where the reference's softmax gives NaN; an int8 output (q_scale) is quantized
in the kernel's store. Both: head dims 16..128, query
heads a multiple of KV heads, masks broadcastable to (B, Hq, Sq, Skv).
"""

from __future__ import annotations

from kiln.kernels import attention
from kiln.kernels.common import smem_limit
from kiln.tactics.common import attention_output, first, rank
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.torch_attention import attention_reason
from kiln.tactics.triton_common import io_reason


def _mask_reason(mask, full: tuple) -> str | None:
    """Why `mask` does not broadcast to `full` (B, Hq, Sq, Skv), or None."""
    if mask.shape is None or len(mask.shape) > len(full):
        return "mask rank unknown or above the scores' rank"
    for m, f in zip(reversed(mask.shape), reversed(full)):
        if m != 1 and m != f:
            return f"mask shape {list(mask.shape)} does not broadcast to {list(full)}"
    return None


def _supports(spec: LayerSpec, device) -> str | None:
    reason = attention_reason(spec, device)
    if reason:
        return reason
    q, k, v = (v.shape for v in spec.inputs[:3])
    mask = spec.inputs[3] if len(spec.inputs) > 3 else None
    return (_shape_reason(q, k, v, mask, (q[0], q[1], q[2], k[2]))
            or io_reason(spec, [*spec.inputs[:3], spec.outputs[0]], device))


def _shape_reason(q: tuple, k: tuple, v: tuple, mask, full: tuple) -> str | None:
    """Why 4-D (B, H, S, D) shapes q, k, v and `mask` do not fit the kernel, or None."""
    d, dv = q[-1], v[-1]
    if not (isinstance(d, int) and isinstance(dv, int) and 16 <= d <= 128 and 16 <= dv <= 128):
        return f"head dims {d} / {dv} are not static within 16..128"
    hq, hkv = q[1], k[1]
    if not (isinstance(hq, int) and isinstance(hkv, int) and hkv > 0 and hq % hkv == 0) or v[1] != hkv:
        return f"query heads {hq} are not a known multiple of KV heads {hkv}"
    if not q[0] == k[0] == v[0] or k[2] != v[2] or k[3] != d:
        return "Q, K and V batch, key length or head dims do not match"
    return _mask_reason(mask, full) if mask is not None else None


def _compile(spec: LayerSpec, config, device):
    causal, scale, tf32 = bool(spec.attrs.get("is_causal")), spec.attrs.get("scale"), spec.tf32

    def run(inputs, out=None):
        mask = inputs[3] if len(inputs) > 3 else None
        return [attention.attention(*inputs[:3], mask, causal=causal, scale=scale, config=config, tf32=tf32,
                                    out=first(out))]

    return run


def _four_d(shape: tuple) -> tuple:
    return shape if len(shape) == 4 else (shape[0], 1, *shape[1:])


def _supports_fused(spec: LayerSpec, device) -> str | None:
    """FusedAttention: Q [..., Sq, D], KT [..., D, Skv], V [..., Skv, Dv] of one rank, 3 or 4."""
    q, kt, v = spec.inputs[:3]
    if rank(q) not in (3, 4) or rank(kt) != rank(q) or rank(v) != rank(q):
        return "Q, KT and V must all be 3-D or all 4-D"
    q4, kt4, v4 = _four_d(q.shape), _four_d(kt.shape), _four_d(v.shape)
    mask = spec.inputs[3] if len(spec.inputs) > 3 else None
    out, why = attention_output(spec)
    float_mask = [mask] if mask is not None and mask.dtype.is_float else []  # else a keep mask, any integer type
    return why or (_shape_reason(q4, (*kt4[:2], kt4[3], kt4[2]), v4, mask, (*q.shape[:-1], kt.shape[-1]))
                   or io_reason(spec, [*spec.inputs[:3], *float_mask, out], device))


def _configs(spec: LayerSpec, device, level: int):
    q, v = spec.inputs[0], spec.inputs[2]
    sq = q.shape[-2] if isinstance(q.shape[-2], int) else None
    return attention.configs(sq, q.shape[-1], v.shape[-1], q.dtype.torch.itemsize, smem_limit(device), level)


def _compile_fused(spec: LayerSpec, config, device):
    scale, tf32, q_scale = spec.attrs.get("scale"), spec.tf32, spec.attrs.get("q_scale")
    fill = spec.attrs.get("mask_fill")  # a keep mask's value for the keys it masks (None: -inf)

    def run(inputs, out=None):
        q, kt, v = inputs[:3]
        mask = inputs[3] if len(inputs) > 3 else None
        three_d = q.dim() == 3
        if three_d:  # (N, S, D) as N batches of one head
            q, kt, v = q.unsqueeze(1), kt.unsqueeze(1), v.unsqueeze(1)
            mask = mask.unsqueeze(-3) if mask is not None and mask.dim() == 3 else mask
        # 4-D: the output in (B, S, H, D) memory, so the usual head merge (transpose, reshape) is a view
        y = attention.attention(q, kt.transpose(-1, -2), v, mask, scale=scale, config=config, tf32=tf32,
                                heads_inner=not three_d, q_scale=q_scale, mask_fill=fill, out=first(out))
        return [y.squeeze(1) if three_d else y]

    return run


register(Tactic("triton_flash_attention", ("Attention",), _compile, _supports, _configs, priority=20,
                writes_out=True))
register(Tactic("triton_fused_attention", ("FusedAttention",), _compile_fused, _supports_fused, _configs,
                priority=20, writes_out=True))
