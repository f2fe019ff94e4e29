"""Fold a QuantizeLinear that reads an AddLayerNorm's normalized output into that layer: it then writes the
quantized copy too (a third output), so the int8 / fp8 GEMM after a transformer's add+LayerNorm reads it
without another pass over the row (BERT-base: 24 of its 37 QuantizeLinear layers). SmoothQuant's Mul by 1/s
(quant/smooth.py) between the two folds in as well, as a fifth input: the LayerNorm scales its quantized copy.

    y, s = AddLayerNorm(a, b, γ, β);  y_q = QuantizeLinear(y, s_y)   \
⇒   y, s, y_q = AddLayerNorm{q_scale=s_y}(a, b, γ, β)
    y, s = AddLayerNorm(a, b, γ, β);  y' = Mul(y, c);  y_q = QuantizeLinear(y', s_y)   \
⇒   y, s, y_q = AddLayerNorm{q_scale=s_y}(a, b, γ, β, c)

Only kiln's own per-tensor, zero-point-free, saturating QuantizeLinear with a constant fp32 scale folds, and only a
Mul by a constant vector along the normalized (last) axis whose product nothing else reads; the normalized output
keeps its float readers. A precision pass (quant/pipeline.py): it runs in int8 and fp8 builds.
"""

from __future__ import annotations

import torch

from kiln.ir import DType, Network
from kiln.passes import PassContext
from kiln.passes.eliminate_dead import eliminate_dead

QUANTIZED = (DType.INT8, DType.FP8E4M3)


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


def fold_quantize(net: Network, ctx: PassContext) -> bool:
    """Fold every QuantizeLinear of an AddLayerNorm's output 0 (directly, or through a Mul by a constant per-column
    vector that only it reads) into it, in place (counted in the log as fold_quantize.layers); whether any."""
    producers, consumers, folded = net.producers(), net.consumers(), 0
    for layer in list(net.layers):
        if layer.kind != "QuantizeLinear" or layer.outputs[0] in net.outputs:
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
