"""Fuse a transformer's embedding sum and the LayerNorm after it into one EmbedLayerNorm.

    e = Add(Add(Gather(W, ids), Gather(T, tt)), P); y = LayerNormalization(e, γ, β)   ⇒
    y = EmbedLayerNorm(ids, W, tt, T, "", "", P, γ, β)
    (likewise with AddLayerNorm(Add(...), P, γ, β) whose sum nothing reads)

Terms are Gathers along axis 0 of constant [V, H] tables (token, segment, position lookups) and at most one
constant (folded position embeddings), summed left to right; each broadcasts over the leading dims (its index
tensor or its rows are the trailing dims of the output's). BERT-style models ran four kernels here (two lookups, the
add, the add + LayerNorm) and at batch 64 wrote and re-read the sums; the fused layer reads the table rows once.
"""

from __future__ import annotations

from kiln.ir import DType, Layer, Network
from kiln.passes.fuse_common import closed, fuse
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer

MAX_GATHERS = 3
INDEX = (DType.INT64, DType.INT32)


def _tree(net: Network, t: str, producers, consumers, parent: Layer, depth: int = 0):
    """`t` as a tree of Adds read only by their parent (("add", left, right)), down to leaf tensor names."""
    add = producers.get(t)
    if (depth < 2 and add is not None and add.kind == "Add" and len(add.inputs) == 2
            and single_consumer(net, t, consumers) is parent):
        (left, l_adds), (right, r_adds) = (_tree(net, x, producers, consumers, add, depth + 1) for x in add.inputs)
        return ("add", left, right), [add, *l_adds, *r_adds]
    return t, []


def _order(tree) -> list[str] | None:
    """The leaves in the order the sum is taken, left to right: the inner Add's pair first (addition commutes;
    it does not reassociate), or None for a tree of another shape."""
    if isinstance(tree, str):
        return [tree]
    _, a, b = tree
    if isinstance(a, str) and isinstance(b, str):
        return [a, b]
    inner, leaf = (a, b) if isinstance(b, str) else (b, a)
    if not isinstance(leaf, str) or not all(isinstance(x, str) for x in inner[1:]):
        return None
    return [*inner[1:], leaf]


def _lead_fits(part: tuple | None, lead: tuple) -> bool:
    """`part` (an index tensor's shape, or a constant's rows) is, leading 1s dropped, the trailing dims of `lead`."""
    if part is None or None in part:
        return False
    part = tuple(part)
    while part and part[0] == 1:
        part = part[1:]
    return len(part) <= len(lead) and (not part or tuple(lead[len(lead) - len(part):]) == part)


def _terms(net: Network, leaves: list[str], producers, lead: tuple, width) -> tuple | None:
    """(gathers as (ids, table, layer), the constant or None) for `leaves`, or None where one is neither a Gather
    of a constant [V, width] table along axis 0 nor one constant (the last term)."""
    gathers, const = [], None
    for i, leaf in enumerate(leaves):
        if leaf in net.constants:
            c = net.constants[leaf]
            if (const is not None or i != len(leaves) - 1 or not c.is_floating_point() or c.dim() < 1
                    or c.shape[-1] != width or not _lead_fits(tuple(c.shape[:-1]), lead)):
                return None
            const = leaf
            continue
        g = producers.get(leaf)
        table = net.constants.get(g.inputs[0]) if g is not None and g.kind == "Gather" else None
        ids = net.tensors.get(g.inputs[1]) if table is not None and len(g.inputs) == 2 else None
        if (ids is None or g.attrs.get("axis", 0) != 0 or table.dim() != 2 or table.shape[1] != width
                or not table.is_floating_point() or ids.dtype not in INDEX or not _lead_fits(ids.shape, lead)):
            return None
        gathers.append((g.inputs[1], g.inputs[0], g))
    if not gathers or len(gathers) > MAX_GATHERS:
        return None
    return gathers, const


def _match(net: Network, ln: Layer, producers, consumers) -> tuple[list[Layer], list[str]] | None:
    """(layers replaced, EmbedLayerNorm inputs) for the LayerNorm `ln`, or None."""
    out = net.tensors.get(ln.outputs[0])
    shape = out.shape if out is not None else None
    if not shape or not isinstance(shape[-1], int) or ln.attrs.get("axis", -1) not in (-1, len(shape) - 1):
        return None
    if any(o and (o in net.outputs or consumers.get(o)) for o in ln.outputs[1:]):
        return None  # Mean / InvStdDev, or AddLayerNorm's sum, read elsewhere
    if ln.kind == "AddLayerNorm":
        if len(ln.inputs) > 4:
            return None
        left, adds_l = _tree(net, ln.inputs[0], producers, consumers, ln, 1)
        right, adds_r = _tree(net, ln.inputs[1], producers, consumers, ln, 1)
        tree, adds, affine = ("add", left, right), adds_l + adds_r, ln.inputs[2:4]
    else:
        tree, adds = _tree(net, ln.inputs[0], producers, consumers, ln)
        affine = ln.inputs[1:3]
    leaves = _order(tree)
    terms = leaves and _terms(net, leaves, producers, tuple(shape[:-1]), shape[-1])
    if not terms:
        return None
    gathers, const = terms
    if not any(tuple(net.tensors[ids].shape) == tuple(shape[:-1]) for ids, _, _ in gathers):
        return None  # no lookup spans the whole output
    layers = [ln] + [g for _, _, g in gathers] + adds  # the fused layer takes the LayerNorm's name
    if not closed(net, layers, {ln.outputs[0]}, consumers):
        return None
    pairs = [n for ids, table, _ in gathers for n in (ids, table)] + ["", ""] * (MAX_GATHERS - len(gathers))
    return layers, pairs + [const or "", *(list(affine) + [""])[:2]]


def fuse_embedding(net: Network, ctx: PassContext) -> bool:
    changed = False
    for ln in [l for l in net.layers if l.kind in ("LayerNormalization", "AddLayerNorm")]:
        match = _match(net, ln, net.producers(), net.consumers())
        if match is None:
            continue
        layers, inputs = match
        attrs = {k: v for k, v in ln.attrs.items() if k in ("axis", "epsilon", "stash_type")}
        if fuse(net, layers, "EmbedLayerNorm", inputs, ln.outputs[:1], attrs):
            ctx.record("fuse_embedding.layers", len(layers) - 1)
            changed = True
    return changed
