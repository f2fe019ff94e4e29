"""Move a Transpose of the leading dims below the GEMM that reads it: a GEMM maps rows to rows, so it commutes.

    t = Transpose(x, perm=[1, 0, 2]); y = FusedGemm(t, W, b)   ⇒   u = FusedGemm(x, W, b); y = Transpose(u, [1, 0, 2])

The GEMM then reads its input contiguous and writes its output contiguous, and the Transpose joins the layout
layers below it, which collapse_views can turn into one view (nn.MultiheadAttention's [S, B, E] projections).
Only for a Transpose read by that GEMM alone, keeping the last axis, and a constant 2-D weight.
"""

from __future__ import annotations

from kiln.ir import Network
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer

ROWWISE = ("FusedGemm", "MatMul")  # A [..., K] @ a constant W


def _rowwise(net: Network, layer, t: str) -> bool:
    w = net.constants.get(layer.inputs[1]) if len(layer.inputs) > 1 else None
    return layer.kind in ROWWISE and layer.inputs[0] == t and t not in layer.inputs[1:] and w is not None \
        and w.dim() == 2


def sink_transpose(net: Network, ctx: PassContext) -> bool:
    changed = False
    consumers = net.consumers()
    for tr in [l for l in net.layers if l.kind == "Transpose"]:
        x, t = tr.inputs[0], tr.outputs[0]
        shape, rank = net.tensors[x].shape, len(net.tensors[x].shape or ())
        perm = list(tr.attrs.get("perm") or range(rank)[::-1])
        gemm = single_consumer(net, t, consumers)
        if rank < 3 or perm[-1] != rank - 1 or gemm is None or not _rowwise(net, gemm, t):
            continue
        y = gemm.outputs[0]
        out = net.tensors[y]
        u = net.unique_name(f"{y}_rows")
        net.add_tensor(u, out.dtype, (*shape[:-1], out.shape[-1]) if out.shape is not None else None)
        gemm.inputs[0], gemm.outputs[0] = x, u
        tr.inputs[0], tr.outputs[0] = u, y
        net.layers.remove(tr)
        net.layers.insert(net.layers.index(gemm) + 1, tr)
        del net.tensors[t]
        consumers = net.consumers()
        ctx.record("sink_transpose.layers")
        changed = True
    return changed
