"""Fold an inference BatchNormalization into the Conv or Gemm that feeds it.

    y = Conv(x, W, B); z = BatchNormalization(y, s, b, m, v)   ⇒   z = Conv(x, W·k, (B − m)·k + b),  k = s/√(v+ε)
    y = Gemm(x, W, C); z = BatchNormalization(y, ...)          ⇒   z = Gemm(x, W·k, (β·C − m)·k + b),  β := 1

Only when the producer's weights and all BN parameters are constants, the producer's output has no
other reader, and the BN has a single output (inference mode).
"""

from __future__ import annotations

import torch

from kiln.ir import Layer, Network
from kiln.passes.manager import PassContext
from kiln.passes.rewrite import single_consumer


def _bn_params(net: Network, bn: Layer) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(k, shift) with BN(y) = y·k + shift per channel, computed in float64, or None."""
    if len(bn.inputs) != 5 or any(o for o in bn.outputs[1:]) or bn.attrs.get("training_mode"):
        return None
    vals = [net.constants.get(i) for i in bn.inputs[1:]]
    if any(v is None or v.dim() != 1 for v in vals):
        return None
    scale, bias, mean, var = (v.double() for v in vals)
    k = scale / torch.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return k, bias - mean * k


def _fold_conv(net: Network, conv: Layer, k: torch.Tensor, shift: torch.Tensor) -> bool:
    w = net.constants.get(conv.inputs[1])
    if w is None or w.shape[0] != k.numel() or conv.attrs.get("transposed"):
        return False
    b = net.constants.get(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
    if len(conv.inputs) > 2 and conv.inputs[2] and b is None:
        return False
    new_w = (w.double() * k.reshape(-1, *[1] * (w.dim() - 1))).to(w.dtype)
    new_b = ((b.double() if b is not None else torch.zeros_like(k)) * k + shift).to(w.dtype)
    conv.inputs[1] = _new_constant(net, conv.inputs[1], new_w)
    conv.inputs[2:3] = [_new_constant(net, f"{conv.name}.bias", new_b)]
    return True


def _fold_gemm(net: Network, gemm: Layer, k: torch.Tensor, shift: torch.Tensor) -> bool:
    w = net.constants.get(gemm.inputs[1])
    if w is None or w.dim() != 2:
        return False
    trans_b = bool(gemm.attrs.get("transB", 0))
    if (w.shape[0] if trans_b else w.shape[1]) != k.numel():
        return False
    c = net.constants.get(gemm.inputs[2]) if len(gemm.inputs) > 2 and gemm.inputs[2] else None
    if len(gemm.inputs) > 2 and gemm.inputs[2] and c is None:
        return False
    beta = float(gemm.attrs.get("beta", 1.0))
    new_w = (w.double() * (k[:, None] if trans_b else k[None, :])).to(w.dtype)
    base = c.double() * beta if c is not None else torch.zeros_like(k)
    new_c = (base * k + shift).to(w.dtype)
    gemm.inputs[1] = _new_constant(net, gemm.inputs[1], new_w)
    gemm.inputs[2:3] = [_new_constant(net, f"{gemm.name}.bias", new_c)]
    gemm.attrs["beta"] = 1.0
    return True


def _new_constant(net: Network, base: str, value: torch.Tensor) -> str:
    name = net.unique_name(base)
    net.add_constant(name, value)
    return name


_FOLDERS = {"Conv": _fold_conv, "Gemm": _fold_gemm}


def fold_batchnorm(net: Network, ctx: PassContext) -> bool:
    changed = False
    producers = net.producers()
    consumers = net.consumers()
    for bn in [l for l in net.layers if l.kind == "BatchNormalization"]:
        prod = producers.get(bn.inputs[0])
        if prod is None or prod.kind not in _FOLDERS or single_consumer(net, bn.inputs[0], consumers) is not bn:
            continue
        params = _bn_params(net, bn)
        if params is None or not _FOLDERS[prod.kind](net, prod, *params):
            continue
        # the producer now writes the BN's output directly
        old = prod.outputs[0]
        prod.outputs[0] = bn.outputs[0]
        prod.origin += bn.origin
        net.layers.remove(bn)
        net.tensors.pop(old, None)
        changed = True
    return changed
