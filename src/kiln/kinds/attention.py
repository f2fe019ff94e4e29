"""Reference implementations of the attention layer kinds: Attention, RotaryEmbedding,
LinearAttention, SwiGLU and CausalConvWithState.

Attention is computed exactly as the ONNX pattern writes it (scale → QKᵀ → softcap → bias →
softmax → ·V), each step in the input precision, so that fused GPU tactics (SDPA, flash
attention) can be checked against it.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from kiln.kinds.registry import DTYPE, FLOAT, INT, NONE, STR, kind

_NEG_INF = float("-inf")


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, S, H*D) → (B, H, S, D)."""
    b, s, _ = x.shape
    return x.reshape(b, s, heads, -1).transpose(1, 2)


def _select(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean 'attend' → additive bias: 0 where True, -inf where False."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), _NEG_INF, dtype=dtype, device=allowed.device))


def _mask_bias(mask: torch.Tensor, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """An attn_mask as an additive bias; a short last axis is padded as 'not attended'."""
    pad = kv_len - mask.shape[-1]
    if mask.dtype == torch.bool:
        if pad > 0:
            mask = F.pad(mask, (0, pad), value=False)
        return _select(mask, dtype)
    if pad > 0:
        mask = F.pad(mask, (0, pad), value=_NEG_INF)
    return mask.to(dtype)


def _allowed(q_len: int, kv_len: int, offset, nonpad, attrs, device) -> torch.Tensor | None:
    """Positions allowed by is_causal, the sliding window and nonpad_kv_seqlen (None: all).

    Query i sits at absolute position p = i + offset (bottom-right alignment); offset is the past
    length, or nonpad_kv_seqlen - q_len per batch for an external cache.
    """
    p = torch.arange(q_len, device=device).view(-1, 1) + offset
    j = torch.arange(kv_len, device=device)
    left, right = attrs["left_window_size"], attrs["right_window_size"]
    conds = []
    if attrs["is_causal"]:
        conds.append(j <= p)
    if left >= 0:
        conds.append(p - j <= left)
    if right >= 0:
        conds.append(j - p <= right)
    if nonpad is not None:
        conds.append(j < nonpad.view(-1, 1, 1, 1))
    return functools.reduce(torch.logical_and, conds) if conds else None


def attention_bias(mask, nonpad, q_len: int, kv_len: int, past_len: int, attrs, dtype, device):
    """The additive bias (0 / -inf / float mask) broadcastable to (B, H, q_len, kv_len), or None."""
    bias = None if mask is None else _mask_bias(mask, kv_len, dtype)
    offset = (nonpad.view(-1, 1, 1, 1) - q_len) if (nonpad is not None and past_len == 0) else past_len
    allowed = _allowed(q_len, kv_len, offset, nonpad, attrs, device)
    if allowed is not None:
        structural = _select(allowed, dtype)
        bias = structural if bias is None else bias + structural
    return bias


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis that gives 0 (not NaN) for a row that is all -inf."""
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


@kind("Attention", attrs={"is_causal": INT.req, "kv_num_heads": (INT | NONE).req, "left_window_size": INT.req,
                          "q_num_heads": (INT | NONE).req, "qk_matmul_output_mode": INT.req,
                          "right_window_size": INT.req, "scale": (FLOAT | NONE).req, "softcap": FLOAT.req,
                          "softmax_precision": (DTYPE | NONE).req})
def attention(inputs, attrs):
    """ONNX Attention (opsets 23-25). Inputs: Q, K, V, attn_mask, past_key, past_value,
    nonpad_kv_seqlen. Outputs: Y, present_key, present_value, qk_matmul_output.

    attrs: scale (None: 1/sqrt(head_size)), is_causal, q_num_heads / kv_num_heads (3-D inputs),
    softcap (0: off), softmax_precision (DType or None), qk_matmul_output_mode (0 raw QK,
    1 after softcap, 2 with bias, 3 softmax), left_window_size / right_window_size (-1: unbounded).
    A query row with no attended key gives zeros, not NaN.
    """
    q, k, v, mask, past_k, past_v, nonpad = (list(inputs) + [None] * 7)[:7]
    three_d = q.dim() == 3
    if three_d:
        q = _split_heads(q, attrs["q_num_heads"])
        k = _split_heads(k, attrs["kv_num_heads"])
        v = _split_heads(v, attrs["kv_num_heads"])
    past_len = 0
    if past_k is not None:
        past_len = past_k.shape[2]
        k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
    present_k, present_v = k, v
    dtype = q.dtype
    q_len, kv_len = q.shape[2], k.shape[2]
    bias = attention_bias(mask, nonpad, q_len, kv_len, past_len, attrs, dtype, q.device)

    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # GQA / MQA: KV head h serves query heads h*groups ... h*groups + groups-1
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    root = torch.tensor(math.sqrt(scale), dtype=dtype, device=q.device)
    qk = (q * root) @ (k * root).transpose(-1, -2)
    raw = qk
    softcap = attrs["softcap"]
    if softcap > 0:
        qk = torch.tanh(qk / softcap) * softcap
    logits = qk if bias is None else qk + bias
    mode = attrs["qk_matmul_output_mode"]
    precision = attrs["softmax_precision"]
    probs = _softmax(logits if precision is None else logits.to(precision.torch))
    if bias is not None:  # fully-masked rows are decided on the bias, so NaN logits cannot leak
        probs = torch.where(torch.isneginf(bias.amax(-1, keepdim=True)), torch.zeros_like(probs), probs)
    probs = probs.to(dtype)
    y = probs @ v.to(dtype)
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], q_len, -1)
    qk_out = (raw, qk, logits, probs)[mode].to(dtype)
    return y, present_k, present_v, qk_out


@kind("RotaryEmbedding", attrs={"interleaved": INT.req, "num_heads": (INT | NONE).req, "rotary_embedding_dim": INT.req})
def rotary_embedding(inputs, attrs):
    """ONNX RotaryEmbedding-23. Inputs: X (B, H, S, D) or (B, S, H*D), cos_cache, sin_cache,
    position_ids (optional; without it the caches are (B, S, rd/2)).

    attrs: interleaved (pairs are (2i, 2i+1) instead of (i, i+rd/2)), rotary_embedding_dim
    (rd, 0: the head size; dimensions past rd pass through), num_heads (3-D input only).
    """
    x, cos, sin, pos = (list(inputs) + [None])[:4]
    if x.dim() == 4:
        xs = x.transpose(1, 2)
    else:
        xs = x.reshape(x.shape[0], x.shape[1], attrs["num_heads"], -1)
    rd = attrs["rotary_embedding_dim"] or xs.shape[-1]
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    if cos.shape[-1] != rd // 2 or sin.shape[-1] != rd // 2:
        raise ValueError(f"cos/sin caches have last dimension {cos.shape[-1]}/{sin.shape[-1]}, "
                         f"expected rotary_embedding_dim/2 = {rd // 2}")
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    rot, rest = xs[..., :rd], xs[..., rd:]
    if attrs["interleaved"]:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot.chunk(2, -1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    rot = torch.stack([real, imag], -1).flatten(-2) if attrs["interleaved"] else torch.cat([real, imag], -1)
    out = torch.cat([rot, rest], -1)
    return out.transpose(1, 2) if x.dim() == 4 else out.reshape(x.shape)


def _per_head(x: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """Decay/beta (B, T, H*d or H or 1) → float32 (B, H', T, d or 1) for broadcasting."""
    if x is None:
        return None
    b, t, n = x.shape
    per_dim = n // heads if n >= heads and n % heads == 0 else 1
    return x.float().reshape(b, t, n // per_dim, per_dim).transpose(1, 2)


@kind("LinearAttention", attrs={"chunk_size": INT, "kv_num_heads": INT.req, "q_num_heads": INT.req, "scale": FLOAT.req,
                                "update_rule": STR.req})
def linear_attention(inputs, attrs):
    """ONNX LinearAttention-27, the sequential recurrence in float32. Inputs: query, key, value
    (B, T, H*d), past_state (B, H_kv, d_k, d_v), decay (log-space gate), beta (update rate).

    attrs: q_num_heads, kv_num_heads (GQA), scale (0: 1/sqrt(d_k)), update_rule
    ("linear", "gated", "delta", "gated_delta"). Outputs: output, present_state.
    """
    q, k, v, past, decay, beta = (list(inputs) + [None] * 6)[:6]
    hq, hkv, rule = attrs["q_num_heads"], attrs["kv_num_heads"], attrs["update_rule"]
    q4, k4, v4 = (_split_heads(t, h).float() for t, h in ((q, hq), (k, hkv), (v, hkv)))
    b, _, steps, dk = k4.shape
    state = past.float() if past is not None else q4.new_zeros(b, hkv, dk, v4.shape[-1])
    g4, beta4 = _per_head(decay, hkv), _per_head(beta, hkv)
    scale = attrs["scale"] or 1.0 / math.sqrt(q4.shape[-1])
    outs = []
    for t in range(steps):
        kt, vt = k4[:, :, t], v4[:, :, t]
        if rule in ("gated", "gated_delta"):
            state = state * torch.exp(g4[:, :, t]).unsqueeze(-1)
        if rule in ("delta", "gated_delta"):
            vt = beta4[:, :, t] * (vt - torch.einsum("bhdm,bhd->bhm", state, kt))
        state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        read = state.repeat_interleave(hq // hkv, 1)
        outs.append(scale * torch.einsum("bhd,bhdm->bhm", q4[:, :, t], read))
    out = torch.stack(outs, 2).transpose(1, 2).reshape(b, steps, -1)
    return out.to(q.dtype), state.to(past.dtype if past is not None else q.dtype)


@kind("SwiGLU", attrs={"alpha": FLOAT.req})
def swiglu(inputs, attrs):
    """ONNX SwiGLU-28: Y = A * sigmoid(alpha * A) * B (no broadcasting). attrs: alpha."""
    a, b = inputs
    return a * torch.sigmoid(attrs["alpha"] * a) * b


@kind("CausalConvWithState", attrs={"activation": STR.req})
def causal_conv_with_state(inputs, attrs):
    """ONNX CausalConvWithState-27: depthwise causal conv1d over [past_state | input].

    Inputs: input (B, C, L), weight (C, 1, k), bias (C), past_state (B, C, k-1; zeros if absent).
    attrs: activation ("none", "silu", "swish"; SiLU is computed in float32).
    Outputs: output (B, C, L), present_state (the last k-1 positions of the padded sequence).
    """
    x, w, bias, past = (list(inputs) + [None] * 4)[:4]
    k = w.shape[2]
    if past is None:
        past = x.new_zeros(x.shape[0], x.shape[1], k - 1)
    padded = torch.cat([past, x], 2)
    out = F.conv1d(padded.float(), w.float(), None if bias is None else bias.float(), groups=x.shape[1]).to(x.dtype)
    if attrs["activation"] in ("silu", "swish"):
        out = F.silu(out.float()).to(x.dtype)
    return out, padded[:, :, padded.shape[2] - (k - 1):]
