"""Fuse a matrix product with a constant weight and its bias and activation into one FusedGemm layer.

    y = MatMul(x, W[K,N]); b = Add(y, bias[N]); z = Gelu(b)   \
⇒   z = FusedGemm(x, W, bias)  {trans_b=0, activation=Gelu}
    y = Gemm(x, W[N,K], C[N]) transB=1; z = Tanh(y)           ⇒   z = FusedGemm(x, W, β·C)  {trans_b=1, activation=Tanh}

x is N-D for MatMul (2-D for Gemm, whose alpha must be 1 and transA 0); the bias is a constant of N
elements; the activation (kinds/fused.py) includes the Erf decomposition of GELU and x·Sigmoid(x).
The weight stays as stored; `trans_b` says it is [N, K]. Only when something is absorbed and every
intermediate has no reader outside the pattern and is not a network output.
"""

from __future__ import annotations

import torch

from kiln.ir import Layer, Network
from kiln.passes.fuse_common import closed, fuse, match_activation, other_input
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer


def _as_bias(net: Network, name: str, n: int, out_rank: int, beta: float = 1.0) -> str | torch.Tensor | None:
    """The [n] bias equal to `beta · name` broadcast over the last axis of a rank-`out_rank` output:
    the constant's own name when it already is one, else its new value."""
    c = net.constants.get(name)
    if not isinstance(c, torch.Tensor) or c.dim() > out_rank or not c.dtype.is_floating_point:
        return None
    if c.numel() not in (1, n) or any(d != 1 for d in c.shape[:-1]):
        return None
    if c.shape == (n,) and beta == 1.0:
        return name
    return (c * beta if beta != 1.0 else c).reshape(-1).expand(n).clone()


def _weight(net: Network, layer: Layer) -> tuple[bool, int] | None:
    """(trans_b, N) of a MatMul/Gemm whose weight is a constant 2-D float tensor and that fits FusedGemm."""
    w = net.constants.get(layer.inputs[1])
    x = net.tensors.get(layer.inputs[0])
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or x is None or x.shape is None or not x.dtype.is_float:
        return None
    if layer.kind == "MatMul":
        return (False, w.shape[1]) if len(x.shape) >= 2 else None
    a = layer.attrs
    if a.get("transA") or a.get("alpha", 1.0) != 1.0:
        return None
    trans_b = bool(a.get("transB"))
    return trans_b, w.shape[0] if trans_b else w.shape[1]


def _match(net: Network, mm: Layer, consumers) -> tuple[list[Layer], str | torch.Tensor | None, dict, str] | None:
    """(layers, bias, attrs, output) of the FusedGemm that `mm` and its epilogue make, or None."""
    fit = _weight(net, mm)
    if fit is None:
        return None
    trans_b, n = fit
    y, layers, rank = mm.outputs[0], [mm], len(net.tensors[mm.outputs[0]].shape or ())
    bias = None
    if mm.kind == "Gemm" and len(mm.inputs) > 2 and mm.inputs[2]:
        bias = _as_bias(net, mm.inputs[2], n, 2, float(mm.attrs.get("beta", 1.0)))
        if bias is None:
            return None
    add = single_consumer(net, y, consumers)
    c = add and add.kind == "Add" and other_input(add, y)
    if bias is None and c and (bias := _as_bias(net, c, n, rank)) is not None:
        layers, y = layers + [add], add.outputs[0]
    act = match_activation(net, y, consumers)
    if act:
        layers, y = layers + act.layers, act.out
    if len(layers) == 1 or not closed(net, layers, {y}, consumers):
        return None
    attrs = {"trans_b": trans_b, "activation": act.name if act else "none",
             "activation_params": act.params if act else []}
    return layers, bias, attrs, y


def fuse_gemm_epilogue(net: Network, ctx: PassContext) -> bool:
    changed = False
    consumers = net.consumers()
    used: set[int] = set()
    for mm in [l for l in net.layers if l.kind in ("MatMul", "Gemm")]:
        match = _match(net, mm, consumers)
        if match is None or used & {id(l) for l in match[0]}:
            continue
        layers, bias, attrs, out = match
        new_bias = isinstance(bias, torch.Tensor)
        if new_bias:
            name = net.unique_name(f"{layers[0].name}.bias")
            net.add_constant(name, bias)
            bias = name
        if fuse(net, layers, "FusedGemm", layers[0].inputs[:2] + ([bias] if bias else []), [out], attrs):
            used |= {id(l) for l in layers}
            ctx.record("fuse_gemm_epilogue.layers", len(layers) - 1)
            changed = True
        elif new_bias:  # leave the network as it was
            del net.constants[bias], net.tensors[bias]
    return changed
