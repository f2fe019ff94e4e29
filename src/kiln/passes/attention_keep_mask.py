"""Hand FusedAttention the padding mask itself instead of the additive mask made from it: the attention adds the
mask's low value to the scores of the keys where the mask is zero, so neither the Where nor the Cast to bool before
it runs.

    c = Cast(m, to=bool); f = Flatten(c); r = Reshape(f, s); w = Where(r, 0, L); y = FusedAttention(Q, KT, V, w)
        ⇒   f = Flatten(m); r = Reshape(f, s); y = FusedAttention{mask_fill=L}(Q, KT, V, r)

Exact: s + where(r, 0, L) is where(r, s, s + L), and a Cast to bool is m ≠ 0. Runs after the precision stage, so L
is the value the additive mask holds (finfo(float32).min as Hugging Face writes it, -65504 once in fp16). Each
encoder layer's attention reads the same mask, so two kernels of the prologue go (BERT, MiniLM).
"""

from __future__ import annotations

import math

from kiln.ir import DType, Layer, Network
from kiln.passes.fuse_common import scalar
from kiln.passes.manager import PassContext

VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _keep_of(net: Network, where: Layer | None) -> tuple[str, float] | None:
    """(the boolean condition c, L) of Where(c, 0, L) with L finite or -inf, else None."""
    if where is None or where.kind != "Where" or len(where.inputs) != 3:
        return None
    zero, low = scalar(net, where.inputs[1]), scalar(net, where.inputs[2])
    ok = zero == 0.0 and low is not None and (math.isfinite(low) or low == -math.inf)
    return (where.inputs[0], low) if ok else None


def _drop_cast(net: Network, keep: str, readers: list[Layer]) -> bool:
    """Where `keep` is a Cast to bool of an integer or bool tensor, through layout layers that only `readers` (at the
    end) and the next view read: the views read the Cast's input instead, retyped, and the Cast goes."""
    producers, consumers = net.producers(), net.consumers()
    chain, t = [], keep
    if {id(l) for l in consumers.get(t, [])} != {id(l) for l in readers} or t in net.outputs:
        return False
    while (layer := producers.get(t)) is not None and layer.kind in VIEWS:
        src = layer.inputs[0]
        if len(consumers.get(src, [])) != 1 or src in net.outputs or src in layer.inputs[1:]:
            return False
        chain.append(layer)
        t = src
    if layer is None or layer.kind != "Cast" or layer.attrs.get("to") is not DType.BOOL:
        return False
    x = layer.inputs[0]
    dtype = net.tensors[x].dtype
    if net.tensors[x].kind != "tensor" or not (dtype.is_int or dtype is DType.BOOL):
        return False
    for view in chain:
        net.tensors[view.outputs[0]].dtype = dtype
    if chain:
        chain[-1].inputs[0] = x
    else:
        for reader in readers:
            reader.inputs[3] = x
    net.layers.remove(layer)
    del net.tensors[t]
    return True


def attention_keep_mask(net: Network, ctx: PassContext) -> bool:
    changed = False
    producers, consumers = net.producers(), net.consumers()
    for w in dict.fromkeys(l.inputs[3] for l in net.layers if l.kind == "FusedAttention" and len(l.inputs) > 3
                           and l.inputs[3]):
        where = producers.get(w)
        found = _keep_of(net, where)
        readers = consumers.get(w, [])
        if found is None or w in net.outputs or any(r.kind != "FusedAttention" or r.inputs.index(w) != 3
                                                    for r in readers):
            continue
        keep, low = found
        for reader in readers:
            reader.inputs[3] = keep
            reader.attrs["mask_fill"] = None if low == -math.inf else low
        net.layers.remove(where)
        del net.tensors[w]
        _drop_cast(net, keep, readers)
        ctx.record("attention_keep_mask.layers", len(readers))
        producers, consumers = net.producers(), net.consumers()
        changed = True
    return changed
