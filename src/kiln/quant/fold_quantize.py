"""Fold a QuantizeLinear that reads an AddLayerNorm's normalized output into that layer: it then writes the
quantized copy too (a third output), so the int8 / fp8 GEMM after a transformer's add+LayerNorm reads it
without another pass over the row (BERT-base: 24 of its 37 QuantizeLinear layers). SmoothQuant's Mul by 1/s
(quant/smooth.py) between the two folds in as well, as a fifth input: the LayerNorm scales its quantized copy.

    y, s = AddLayerNorm(a, b, γ, β);  y_q = QuantizeLinear(y, s_y)   \
⇒   y, s, y_q = AddLayerNorm{q_scale=s_y}(a, b, γ, β)
    y, s = AddLayerNorm(a, b, γ, β);  y' = Mul(y, c);  y_q = QuantizeLinear(y', s_y)   \
⇒   y, s, y_q = AddLayerNorm{q_scale=s_y}(a, b, γ, β, c)

An int8 QuantizeLinear that reads a FusedAttention's output through views (the head merge: Transpose, Reshape) folds
into the attention, which then writes int8, and the views carry int8: a per-tensor quantize commutes with them.

    y = FusedAttention(Q, KT, V, m);  t = Transpose(y);  r = Reshape(t, s);  y_q = QuantizeLinear(r, s_y)   \
⇒   y' = FusedAttention{q_scale=s_y}(Q, KT, V, m);  t' = Transpose(y');  y_q = Reshape(t', s)

Only kiln's own per-tensor, zero-point-free, saturating QuantizeLinear with a constant fp32 scale folds, and only a
Mul by a constant vector along the normalized (last) axis whose product nothing else reads; the normalized output
keeps its float readers; an attention output or view that anything else reads stays. A precision pass
(quant/pipeline.py): it runs in int8 and fp8 builds.
"""

from __future__ import annotations

import torch

from kiln.ir import DType, Network
from kiln.passes import PassContext
from kiln.passes.eliminate_dead import eliminate_dead

QUANTIZED = (DType.INT8, DType.FP8E4M3)
VIEWS = ("Transpose", "Reshape")  # layout-only layers a per-tensor quantize commutes with


def _scale(net: Network, layer) -> float | None:
    """The QuantizeLinear's one constant fp32 scale, when it is the plain kind kiln inserts."""
    a = layer.attrs
    if a.get("output_dtype") not in QUANTIZED or a.get("block_size", 0) or not a.get("saturate", True) or \
            a.get("precision") not in (None, DType.FLOAT32) or (len(layer.inputs) > 2 and layer.inputs[2]):
        return None
    s = net.constants.get(layer.inputs[1])
    return float(s.reshape(-1)[0]) if isinstance(s, torch.Tensor) and s.numel() == 1 and \
        s.dtype == torch.float32 else None


def _row_vector(net: Network, mul, y: str) -> str | None:
    """The constant the Mul multiplies `y` by, when it holds one value per column of y's rows ([N], [1, ..., N])."""
    c = mul.inputs[1] if mul.inputs[0] == y else mul.inputs[0]
    value, shape = net.constants.get(c), net.tensors[y].shape
    ok = isinstance(value, torch.Tensor) and value.is_floating_point() and shape and value.dim() <= len(shape) \
        and value.numel() == value.shape[-1] == shape[-1]
    return c if ok and len(mul.inputs) == 2 else None


def _into_attention(net: Network, quant, producers, consumers) -> bool:
    """Fold the int8 QuantizeLinear `quant` into the FusedAttention it reads through views only it reads (the views
    then carry int8); whether it did."""
    scale, views, t = _scale(net, quant), [], quant.inputs[0]
    if scale is None or quant.attrs["output_dtype"] is not DType.INT8:
        return False
    while (p := producers.get(t)) is not None and p.kind in VIEWS:
        if t in net.outputs or len(consumers.get(t, [])) != 1:
            return False
        views.append(p)
        t = p.inputs[0]
    if p is None or p.kind != "FusedAttention" or t in net.outputs or len(consumers.get(t, [])) != 1 or \
            p.attrs.get("q_scale") is not None:
        return False
    chain = [p, *reversed(views)]  # the attention, then its views outward: each output retyped int8, renamed
    names = [net.unique_name(f"{layer.outputs[0]}_int8") for layer in chain[:-1]] + [quant.outputs[0]]
    for layer, name in zip(chain[:-1], names):
        net.add_tensor(name, DType.INT8, net.tensors[layer.outputs[0]].shape)
    for i, (layer, name) in enumerate(zip(chain, names)):
        layer.outputs = [name]
        if i:
            layer.inputs = [names[i - 1], *layer.inputs[1:]]
    p.attrs = dict(p.attrs, q_scale=scale, q_dtype=DType.INT8)
    net.layers.remove(quant)
    return True


def fold_quantize(net: Network, ctx: PassContext) -> bool:
    """Fold every QuantizeLinear of an AddLayerNorm's output 0 (directly, or through a Mul by a constant per-column
    vector that only it reads) into it, and every int8 one of a FusedAttention's output (through views only), in
    place (counted in the log as fold_quantize.layers); whether any."""
    producers, consumers, folded = net.producers(), net.consumers(), 0
    for layer in list(net.layers):
        if layer.kind != "QuantizeLinear" or layer.outputs[0] in net.outputs:
            continue
        if _into_attention(net, layer, producers, consumers):
            folded += 1
            continue
        source, mul, vector = layer.inputs[0], None, None
        first = producers.get(source)
        if first is not None and first.kind == "Mul" and source not in net.outputs and \
                len(consumers.get(source, [])) == 1:
            y = next((x for x in first.inputs if getattr(producers.get(x), "kind", None) == "AddLayerNorm"), None)
            vector = _row_vector(net, first, y) if y is not None else None
            if vector is not None:
                source, mul = y, first
        ln, scale = producers.get(source), _scale(net, layer)
        if ln is None or ln.kind != "AddLayerNorm" or ln.outputs[0] != source or scale is None or \
                ln.attrs.get("q_scale") is not None:
            continue
        ln.outputs = (list(ln.outputs) + [""])[:2] + [layer.outputs[0]]
        if mul is not None:
            ln.inputs = (list(ln.inputs) + [""] * 4)[:4] + [vector]
            net.layers.remove(mul)
        ln.attrs = dict(ln.attrs, q_scale=scale, q_dtype=layer.attrs["output_dtype"])
        net.layers.remove(layer)
        folded += 1
    if folded:
        eliminate_dead(net, PassContext())  # the build's log counts only what the pass did
        ctx.record("fold_quantize.layers", folded)
    return bool(folded)
