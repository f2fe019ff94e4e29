"""Fuse the attention pattern exporters write into one FusedAttention layer (kinds/fused.py).

    s = MatMul(Q, KT); t = Mul(s, c) | Div(s, 1/c); u = Add(t, mask); p = Softmax(u, axis=-1); y = MatMul(p, V)
        ⇒   y = FusedAttention(Q, KT, V, mask)  {scale=c, scale_on="scores"}
    s = MatMul(Mul(Q, r), Mul(KT, r)); p = Softmax(s); y = MatMul(p, V)      (torch's SDPA decomposition)
        ⇒   y = FusedAttention(Q, KT, V)  {scale=r², scale_on="qk"}
    p = Softmax(u); y = MatMul(Where(IsNaN(p), 0, p), V)      (SDPA's safe softmax, as both exporters write it)
        ⇒   y = FusedAttention(...)  {nan_to_zero=True}

Scale and mask are optional; c and r are one-element constants, or r = √(1/√D) computed at run
time from Shape(Q) (the TorchScript exporter's SDPA), which becomes scale=None. The existing
Attention kind does not fit exactly (it pads a short mask as "not attended" and zeroes fully
masked rows), hence its own kind. Only when every intermediate has no reader outside the pattern
and is not a network output.
"""

from __future__ import annotations

import math

import torch

from kiln.ir import Layer, Network
from kiln.kinds import run_reference
from kiln.passes.fuse_common import closed, fuse, other_input, scalar
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer

ROOT = "root"  # the factor √(1/√D), D = Q's last dim
_INDEX_KINDS = ("Slice", "Gather", "Squeeze", "Unsqueeze", "Reshape")


def _last_dim_of(net: Network, t: str, producers) -> str | None:
    """The tensor whose last dimension `t` is (Shape followed by index ops with constant operands)."""
    chain, layer = [], producers.get(t)
    while layer is not None and layer.kind in _INDEX_KINDS and all(i in net.constants for i in layer.inputs[1:] if i):
        chain.append(layer)
        layer = producers.get(layer.inputs[0])
    if layer is None or layer.kind != "Shape" or net.tensors[layer.inputs[0]].shape is None:
        return None
    rank = len(net.tensors[layer.inputs[0]].shape)
    value = run_reference("Shape", [torch.empty(tuple(range(1, rank + 1)))], layer.attrs)[0]  # dim i has size i+1
    for step in reversed(chain):
        value = run_reference(step.kind, [value] + [net.constants.get(i) for i in step.inputs[1:]], step.attrs)[0]
    return layer.inputs[0] if value.numel() == 1 and int(value.reshape(())) == rank else None


def _is_root(net: Network, t: str, q: str, producers) -> bool:
    """t = Sqrt(Div(1, Sqrt(Cast(last dim of q))))."""
    kinds = []
    layer = producers.get(t)
    for expected in ("Sqrt", "Div", "Sqrt", "Cast"):
        if layer is None or layer.kind != expected:
            return False
        if expected == "Div" and scalar(net, layer.inputs[0]) != 1.0:
            return False
        kinds.append(layer)
        layer = producers.get(layer.inputs[-1] if expected == "Div" else layer.inputs[0])
    return _last_dim_of(net, kinds[-1].inputs[0], producers) == q


def _factor(net: Network, layer: Layer | None, x: str, q: str, producers) -> float | str | None:
    """The scale `layer` applies to x (Mul by / Div by a one-element constant, or Mul by ROOT)."""
    if layer is None or layer.kind not in ("Mul", "Div") or (layer.kind == "Div" and layer.inputs[0] != x):
        return None
    c = other_input(layer, x)
    x_shape, c_shape = net.tensors[x].shape, net.tensors[c].shape if c else None
    if c is None or x_shape is None or c_shape is None or len(c_shape) > len(x_shape):  # no broadcast to more dims
        return None
    value = scalar(net, c)
    if value is not None and value != 0.0:
        return value if layer.kind == "Mul" else 1.0 / value
    return ROOT if layer.kind == "Mul" and _is_root(net, c, q, producers) else None


def _side(net: Network, t: str, q_hint: str | None, consumers,
          producers) -> tuple[str, float | str | None, Layer | None]:
    """(unscaled tensor, factor, scaling layer) of one MatMul operand; factor None when unscaled."""
    layer = producers.get(t)
    if layer is None or single_consumer(net, t, consumers) is None or layer.kind not in ("Mul", "Div"):
        return t, None, None
    for src in layer.inputs:
        f = _factor(net, layer, src, q_hint or src, producers) if other_input(layer, src) else None
        if f is not None:
            return src, f, layer
    return t, None, None


def _scale(fq, fk, fs) -> tuple[float | None, str] | None:
    """(scale attr, scale_on) for the factors on Q, KT and the scores, or None if not expressible."""
    if fq == ROOT or fk == ROOT:
        return (None, "qk") if fq == fk == ROOT and fs is None else None
    if fq is not None and fq == fk and fs is None:
        return fq * fk, "qk"
    return float(math.prod(f for f in (fq, fk, fs) if f is not None)), "scores"


def _nan_guard(net: Network, p: str, consumers) -> list[Layer]:
    """[IsNaN, Where] of Where(IsNaN(p), 0, p) when they are p's only readers, else []."""
    readers = consumers.get(p, [])
    isnan = next((l for l in readers if l.kind == "IsNaN"), None)
    where = isnan and single_consumer(net, isnan.outputs[0], consumers)
    if (not where or where.kind != "Where" or {id(l) for l in readers} != {id(isnan), id(where)}
            or where.inputs[0] != isnan.outputs[0] or where.inputs[2] != p or scalar(net, where.inputs[1]) != 0.0):
        return []
    return [isnan, where]


def _match(net: Network, sm: Layer, consumers, producers):
    """(layers, inputs, attrs, output) of the attention ending at Softmax `sm`, or None."""
    rank = len(net.tensors[sm.inputs[0]].shape or ())
    if sm.attrs.get("flatten") or sm.attrs.get("axis", -1) not in {-1, rank - 1}:
        return None
    guard = _nan_guard(net, sm.outputs[0], consumers)
    p = guard[-1].outputs[0] if guard else sm.outputs[0]
    pv = single_consumer(net, p, consumers)
    if pv is None or pv.kind != "MatMul" or pv.inputs[0] != p or pv.inputs[1] == p:
        return None
    layers, t, mask, fs = [sm, *guard, pv], sm.inputs[0], "", None
    add = producers.get(t)
    if add is not None and add.kind == "Add" and len(add.inputs) == 2:
        for i in (0, 1):
            p = producers.get(add.inputs[i])
            if p is not None and p.kind in ("MatMul", "Mul", "Div"):
                layers, t, mask = layers + [add], add.inputs[i], add.inputs[1 - i]
                break
    qk = producers.get(t)
    if qk is not None and qk.kind in ("Mul", "Div"):
        src = next((s for s in qk.inputs if producers.get(s) is not None and producers[s].kind == "MatMul"), None)
        fs = _factor(net, qk, src, "", producers) if src and other_input(qk, src) else None
        if fs is None or fs == ROOT:
            return None
        layers, t, qk = layers + [qk], src, producers[src]
    if qk is None or qk.kind != "MatMul" or qk.inputs[0] == qk.inputs[1]:
        return None
    layers.append(qk)
    q, fq, q_mul = _side(net, qk.inputs[0], None, consumers, producers)
    k, fk, k_mul = _side(net, qk.inputs[1], q, consumers, producers)
    scale = _scale(fq, fk, fs)
    if scale is None:  # a run-time factor on one side only: keep both scalings outside
        (q, fq, q_mul), (k, fk, k_mul) = (qk.inputs[0], None, None), (qk.inputs[1], None, None)
        scale = _scale(None, None, fs)
    layers += [m for m in (q_mul, k_mul) if m is not None]
    out = pv.outputs[0]
    dtypes = {net.tensors[n].dtype for n in (q, k, pv.inputs[1], out) + ((mask,) if mask else ())}
    if len(dtypes) != 1 or not dtypes.pop().is_float or not closed(net, layers, {out}, consumers):
        return None
    return layers, [q, k, pv.inputs[1]] + ([mask] if mask else []), {"scale": scale[0], "scale_on": scale[1],
                                                                   "nan_to_zero": bool(guard)}, out


def fuse_attention(net: Network, ctx: PassContext) -> bool:
    changed = False
    consumers, producers = net.consumers(), net.producers()
    used: set[int] = set()
    for sm in [l for l in net.layers if l.kind == "Softmax"]:
        match = _match(net, sm, consumers, producers)
        if match is None or used & {id(l) for l in match[0]}:
            continue
        layers, inputs, attrs, out = match
        if fuse(net, layers, "FusedAttention", inputs, [out], attrs):
            used |= {id(l) for l in layers}
            ctx.record("fuse_attention.layers", len(layers) - 1)
            changed = True
    return changed
