"""Read the quantization an explicit Q/DQ model (ONNX Runtime QDQ format, QAT exports) writes, before any pass.

    x ─▶ QuantizeLinear(s) ─▶ DequantizeLinear(s) ─▶ y ─▶ Conv(y, DequantizeLinear(W_q, s_w))
        ⇒   x ─▶ Conv(x, W)      with scales.activations[x] = s, scales.weights[W] = (W_q, s_w)

Activation pairs (per-tensor symmetric int8: same scale, zero point 0) are taken out of the graph and
their scale recorded; weight DequantizeLinear layers stay and are folded, their int8 values recorded.
The int8 rewrite (int8.py) then runs each layer the model quantized in int8 with exactly these scales,
and puts an explicit Q → DQ pair back in front of every other reader, so nothing the model wrote is lost.
Pairs it does not read (zero point ≠ 0, uint8, per-axis or blocked activations, a network output)
stay in the graph as written and run as QuantizeLinear / DequantizeLinear layers.
"""

from __future__ import annotations

import torch

from kiln.ir import DType, Layer, Network
from kiln.passes import PassContext
from kiln.passes.eliminate_dead import eliminate_dead
from kiln.quant.scheme import QuantScales, TensorScale, WeightQuant


def has_qdq(net: Network) -> bool:
    return any(layer.kind in ("QuantizeLinear", "DequantizeLinear") for layer in net.layers)


def _zero(net: Network, layer: Layer) -> bool:
    """The layer's zero point is absent or all zeros."""
    if len(layer.inputs) < 3 or not layer.inputs[2]:
        return True
    zp = net.constants.get(layer.inputs[2])
    return isinstance(zp, torch.Tensor) and not zp.is_floating_point() and not bool(zp.any())


def _scalar_scale(net: Network, layer: Layer) -> float | None:
    s = net.constants.get(layer.inputs[1])
    if not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32 or not bool(s.reshape(()) > 0):
        return None
    return float(s.reshape(()))


def _weight(net: Network, dq: Layer) -> WeightQuant | None:
    """The int8 weight a DequantizeLinear of a constant holds."""
    q, s = net.constants.get(dq.inputs[0]), net.constants.get(dq.inputs[1])
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8 or not isinstance(s, torch.Tensor) \
            or s.dtype != torch.float32 or s.dim() > 1 or dq.attrs.get("block_size", 0) or not _zero(net, dq):
        return None
    return WeightQuant(q.clone(), s.clone(), int(dq.attrs.get("axis", 1)))


def absorb_qdq(net: Network) -> QuantScales:
    """Record the model's Q/DQ scales and take its activation pairs out (module docstring); in place."""
    scales = QuantScales(qdq=True)
    producers, outputs = net.producers(), set(net.outputs)
    alias: dict[str, str] = {}
    kept_pairs = 0
    for dq in [layer for layer in net.layers if layer.kind == "DequantizeLinear"]:
        if dq.inputs[0] in net.constants:
            if (w := _weight(net, dq)) is not None:
                scales.weights[dq.outputs[0]] = w
            continue
        q = producers.get(dq.inputs[0])
        if q is None or q.kind != "QuantizeLinear":
            continue
        s, x = _scalar_scale(net, q), alias.get(q.inputs[0], q.inputs[0])
        ok = (s is not None and s == _scalar_scale(net, dq) and q.attrs["output_dtype"] is DType.INT8
              and _zero(net, q) and _zero(net, dq) and dq.outputs[0] not in outputs
              and net.tensors[x].dtype is DType.FLOAT32 and dq.attrs["output_dtype"] is DType.FLOAT32
              and scales.activations.get(x, TensorScale(s, "")).scale == s)
        if not ok:
            kept_pairs += 1
            continue
        scales.activations[x] = TensorScale(s, "Q/DQ")
        alias[dq.outputs[0]] = x
    for layer in net.layers:
        layer.inputs = [alias.get(n, n) if n else n for n in layer.inputs]
    eliminate_dead(net, PassContext())
    if kept_pairs:
        scales.notes.append(f"int8: {kept_pairs} Q/DQ pairs are not per-tensor symmetric int8 on float32 data (or "
                            "write a network output): they run as written, as QuantizeLinear/DequantizeLinear layers")
    return scales
