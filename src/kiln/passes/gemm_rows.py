"""Keep a GEMM's leading dims instead of flattening them to rows and splitting them back after it.

    m = Reshape(x [S, B, H, D], [S·B, E]); y = Gemm(m, W, b); z = Reshape(y, [S, B, N])
        ⇒   m = Reshape(x, [S, B, E]); z = FusedGemm(m, W, b)

A GEMM maps rows to rows, so it can run on [S, B, E] as well: the merge of S and B, which is no view when x is a
permuted view (nn.MultiheadAttention's output projection after the heads merge), is gone, and the FusedGemm
runs on the rows in memory order. Only for a constant 2-D weight, a constant [N] bias and alpha = beta = 1.
"""

from __future__ import annotations

import math

import torch

from kiln.ir import Layer, Network
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer


def _fused_attrs(net: Network, g: Layer) -> dict | None:
    """The FusedGemm attributes of a Gemm / FusedGemm with a constant 2-D weight and a constant [N] bias, or None."""
    w = net.constants.get(g.inputs[1]) if len(g.inputs) > 1 else None
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return None
    if g.kind == "FusedGemm":
        return dict(g.attrs)
    a = g.attrs
    if g.kind != "Gemm" or a.get("transA") or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        return None
    n = w.shape[0] if a.get("transB") else w.shape[1]
    c = g.inputs[2] if len(g.inputs) > 2 else ""
    if c and (c not in net.constants or tuple(net.constants[c].shape) != (n,)):
        return None
    return {"trans_b": bool(a.get("transB")), "activation": "none", "activation_params": []}


def _static(net: Network, name: str) -> tuple | None:
    t = net.tensors.get(name)
    return tuple(t.shape) if t is not None and t.is_static else None


def gemm_rows(net: Network, ctx: PassContext) -> bool:
    changed = False
    consumers, producers = net.consumers(), net.producers()
    for g in [l for l in net.layers if l.kind in ("Gemm", "FusedGemm")]:
        m = g.inputs[0]
        r1, r2 = producers.get(m), single_consumer(net, g.outputs[0], consumers)
        if r1 is None or r1.kind != "Reshape" or r2 is None or r2.kind != "Reshape" \
                or single_consumer(net, m, consumers) is not g or g.inputs.count(m) != 1:
            continue
        x, rows, z = _static(net, r1.inputs[0]), _static(net, m), _static(net, r2.outputs[0])
        attrs = _fused_attrs(net, g)
        if attrs is None or x is None or rows is None or z is None or len(rows) != 2 or len(z) < 3:
            continue
        lead, k = z[:-1], rows[1]
        if math.prod(lead) != rows[0] or x[:len(lead)] != lead or math.prod(x[len(lead):]) != k:
            continue
        shape = net.unique_name(f"{m}_shape")
        net.add_constant(shape, torch.tensor([*lead, k], dtype=torch.int64))
        r1.inputs = [r1.inputs[0], shape]
        net.tensors[m].shape = (*lead, k)
        del net.tensors[g.outputs[0]]
        g.kind, g.attrs, g.outputs = "FusedGemm", attrs, [r2.outputs[0]]
        g.origin += r2.origin
        net.layers.remove(r2)
        consumers, producers = net.consumers(), net.producers()
        ctx.record("gemm_rows.layers")
        changed = True
    return changed
