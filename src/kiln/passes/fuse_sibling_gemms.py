"""Merge FusedGemm layers that read the same input into one wider GEMM whose output is split (views, no copy).

    q = FusedGemm(x, Wq, bq); k = FusedGemm(x, Wk, bk); v = FusedGemm(x, Wv, bv)
      ⇒   qkv = FusedGemm(x, [Wq|Wk|Wv], [bq|bk|bv]); q, k, v = Split(qkv, [Nq, Nk, Nv], axis=-1)

Siblings must share the weight orientation (`trans_b`), the activation and its params (applied per
column, so concatenation keeps it exact), and either all have a constant 1-D bias or none has one.
Attention's Q/K/V projections become one launch instead of three.
"""

from __future__ import annotations

import torch

from kiln.ir import Layer, Network
from kiln.passes.manager import PassContext


def _key(net: Network, layer: Layer) -> tuple | None:
    """What siblings must share to be merged, or None when `layer` cannot take part."""
    if layer.kind != "FusedGemm" or len(layer.outputs) != 1 or layer.precision is not None:
        return None
    w = net.constants.get(layer.inputs[1])
    bias = layer.inputs[2] if len(layer.inputs) > 2 and layer.inputs[2] else None
    b = net.constants.get(bias) if bias else None
    out = net.tensors.get(layer.outputs[0])
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or (bias and (not isinstance(b, torch.Tensor) or b.dim() != 1)):
        return None
    if out is None or out.shape is None or not isinstance(out.shape[-1], int):
        return None
    a = layer.attrs
    k = w.shape[1] if a["trans_b"] else w.shape[0]
    return (layer.inputs[0], bool(a["trans_b"]), a["activation"], repr(a["activation_params"]), bias is not None,
            w.dtype, None if b is None else b.dtype, k, out.dtype, tuple(out.shape[:-1]))


def fuse_sibling_gemms(net: Network, ctx: PassContext) -> bool:
    groups: dict[tuple, list[Layer]] = {}
    for layer in net.layers:
        key = _key(net, layer)
        if key is not None:
            groups.setdefault(key, []).append(layer)
    changed = False
    for key, layers in groups.items():
        if len(layers) < 2:
            continue
        _merge(net, layers, trans_b=key[1], has_bias=key[4])
        ctx.record("fuse_sibling_gemms.layers", len(layers))
        changed = True
    return changed


def _merge(net: Network, layers: list[Layer], trans_b: bool, has_bias: bool) -> None:
    """Replace `layers` by one FusedGemm (at the first one's place) and a Split into their outputs."""
    first = layers[0]
    weights = [net.constants[l.inputs[1]] for l in layers]
    sizes = [w.shape[0] if trans_b else w.shape[1] for w in weights]
    w_name = net.unique_name(f"{first.name}.merged_weight")
    net.add_constant(w_name, torch.cat(weights, dim=0 if trans_b else 1))
    inputs = [first.inputs[0], w_name]
    if has_bias:
        b_name = net.unique_name(f"{first.name}.merged_bias")
        net.add_constant(b_name, torch.cat([net.constants[l.inputs[2]] for l in layers]))
        inputs.append(b_name)
    s_name = net.unique_name(f"{first.name}.split_sizes")
    net.add_constant(s_name, torch.tensor(sizes, dtype=torch.int64))
    out0 = net.tensors[first.outputs[0]]
    merged = net.unique_name(f"{first.name}.merged")
    net.add_tensor(merged, out0.dtype, (*out0.shape[:-1], sum(sizes)))
    origin = [o for l in layers for o in l.origin]
    gemm = Layer(net.unique_name(f"{first.name}.merged"), "FusedGemm", inputs, [merged], dict(first.attrs),
                 origin=origin)
    split = Layer(net.unique_name(f"{first.name}.split"), "Split", [merged, s_name], [l.outputs[0] for l in layers],
                  {"axis": -1, "num_outputs": len(layers)}, origin=origin)
    members = {id(l) for l in layers}
    at = net.layers.index(first)
    rest = [l for l in net.layers if id(l) not in members]
    pos = sum(1 for l in net.layers[:at] if id(l) not in members)
    net.layers = rest[:pos] + [gemm, split] + rest[pos:]
