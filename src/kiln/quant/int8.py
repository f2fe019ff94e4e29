"""--int8 / --fp8: rewrite each linear layer whose input has a scale into QuantConv / QuantGemm (kinds/quantized.py).

    x: f32 ─▶ FusedConv(x, W, B){Relu} ─▶ y: f32 ─▶ FusedGemm(y', W2) ─▶ z: f32                    (--int8 ⇒)
    x ─▶ QuantizeLinear(s_x) ─▶ x_q: i8 ─▶ QuantConv(x_q, W_q: i8, w_scale, B){out_scale=s_y} ─▶ y: i8 ─▶ ...

One rewrite for every quantized type (kinds/qtype.py): with --fp8 the same graph holds float8_e4m3fn tensors and
weights and the layers carry qtype=fp8e4m3 (int8 layers carry no qtype attribute, as before fp8 existed).
Quantizable: Conv / FusedConv, and MatMul / Gemm / FusedGemm with a constant 2-D weight, all with fp32 data.
A layer writes the quantized type (requantizing in its epilogue) only when its output has a scale, is no network
output, and every reader is a quantized layer reading it as its quantized input or as its residual (TensorRT's
int8 residual: a QuantConv then adds fp32(r_q)·res_scale, res_scale the tensor's scale, where it added the float
value); otherwise it writes fp32, each quantized reader gets an explicit QuantizeLinear and residuals read fp32.

    a block output y, read by the next block's first conv and, as its residual R, by that block's last conv:
    QuantConv ─▶ y: f32 ─▶ QuantizeLinear ─▶ y_q: i8 ─▶ QuantConv(y_q);  QuantConv(·, R=y)  (float R)
    QuantConv{out_scale=s_y} ─▶ y: i8 ─▶ QuantConv(y);  QuantConv(·, R=y){res_scale=s_y}  (quantized R)

With the model's own Q/DQ (`scales.qdq`), residuals stay float (quantized residuals are for calibrated builds
only), and every other reader of a tensor the model quantized reads it through an explicit QuantizeLinear →
DequantizeLinear pair, so no quantization the model wrote is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kiln.ir import DType, Layer, Network
from kiln.kinds.verify import verify_network
from kiln.kinds.qtype import INT8, QType
from kiln.passes import PassContext
from kiln.passes.eliminate_dead import eliminate_dead
from kiln.quant.scheme import QuantScales, quantize_weight

F32 = DType.FLOAT32
INT32_MAX = 2 ** 31 - 1
FUSED_RESIDUAL = 3  # FusedConv's residual input (QuantConv's is 4)
Q_ATTRS = {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": DType.INT8, "precision": None}
DQ_ATTRS = {"axis": 1, "block_size": 0, "output_dtype": F32}


@dataclass
class Candidate:
    """A layer that has a quantized form: its activation input, weight constant and epilogue."""

    layer: Layer
    conv: bool
    x: str
    weight: str
    out_axis: int            # the weight's output-channel axis as stored
    k: int                   # reduction length (int32 accumulation bound)
    bias: str | torch.Tensor | None
    residual: str | None
    attrs: dict


@dataclass
class Int8Result:
    """What the rewrite did, per layer, for the build summary and `kiln inspect`."""

    layers: dict[str, dict] = field(default_factory=dict)   # name → precision, scale source, reason
    quantize_layers: int = 0
    fake_quant: int = 0

    @property
    def quantized(self) -> list[str]:
        return [n for n, r in self.layers.items() if r["precision"] != "float"]

    @property
    def quantized_residuals(self) -> int:
        """How many quantized layers read their residual in the quantized type (with res_scale)."""
        return sum(r.get("residual", "fp32") != "fp32" for r in self.layers.values())


def _is_f32(net: Network, name: str) -> bool:
    t = net.tensors.get(name)
    return t is not None and t.kind == "tensor" and t.dtype is F32


def _bias(net: Network, name: str, n: int, beta: float = 1.0):
    """An fp32 [n] bias: the constant's name, its value scaled by beta, or False when it is not one."""
    c = net.constants.get(name)
    if not isinstance(c, torch.Tensor) or c.dtype != torch.float32 or c.numel() not in (1, n):
        return False
    if c.shape == (n,) and beta == 1.0:
        return name
    return (c.reshape(-1) * beta).expand(n).clone()


def candidate(net: Network, layer: Layer) -> Candidate | None:
    """The int8 form of `layer`, or None when it has none."""
    if layer.kind not in ("Conv", "FusedConv", "MatMul", "Gemm", "FusedGemm") or len(layer.inputs) < 2:
        return None
    x, w_name = layer.inputs[0], layer.inputs[1]
    w = net.constants.get(w_name)
    if not isinstance(w, torch.Tensor) or w.dtype != torch.float32 or not _is_f32(net, x) \
            or not all(_is_f32(net, o) for o in layer.outputs):
        return None
    if net.tensors[x].shape is None:
        return None
    act = {"activation": layer.attrs.get("activation", "none"), "activation_params": layer.attrs.get(
        "activation_params", [])}
    extra = (layer.inputs + [""] * 4)[2:4]
    if layer.kind in ("Conv", "FusedConv"):
        if w.dim() < 3 or len(net.tensors[x].shape) != w.dim():
            return None
        bias = _bias(net, extra[0], w.shape[0]) if extra[0] else None
        residual = extra[1] if layer.kind == "FusedConv" and layer.attrs.get("residual") else None  # FUSED_RESIDUAL
        attrs = {k: v for k, v in layer.attrs.items() if k not in ("residual", "activation", "activation_params")}
        return None if bias is False else Candidate(layer, True, x, w_name, 0, w[0].numel(), bias, residual,
                                                    attrs | act)
    if w.dim() != 2 or len(net.tensors[x].shape) < 2:
        return None
    if layer.kind == "MatMul":
        return Candidate(layer, False, x, w_name, 1, w.shape[0], None, None, act)
    if layer.kind == "FusedGemm":
        trans_b, bias_name, beta = layer.attrs["trans_b"], extra[0], 1.0
    else:
        a = layer.attrs
        if a.get("transA") or a.get("alpha", 1.0) != 1.0:
            return None
        trans_b, bias_name, beta = bool(a.get("transB")), extra[0], float(a.get("beta", 1.0))
    n = w.shape[0] if trans_b else w.shape[1]
    bias = _bias(net, bias_name, n, beta) if bias_name else None
    return None if bias is False else Candidate(layer, False, x, w_name, 0 if trans_b else 1,
                                                w.shape[1] if trans_b else w.shape[0], bias, None, act)


def candidates(net: Network) -> dict[str, Candidate]:
    return {layer.name: c for layer in net.layers if (c := candidate(net, layer)) is not None}


def _weight(net: Network, c: Candidate, scales: QuantScales, qtype: QType) -> tuple[torch.Tensor, torch.Tensor] | str:
    """(W_q of `qtype` with the output channel first, w_scale fp32 [N]), or why the layer cannot have them."""
    w = net.constants[c.weight]
    if not scales.qdq:
        q, s = quantize_weight(w, c.out_axis, qtype)
        return q.movedim(c.out_axis, 0).contiguous(), s
    if qtype is not INT8:
        return f"the model's own Q/DQ nodes are int8, not {qtype.label}"
    wq = scales.weights.get(c.weight)
    if wq is None:
        return "the model does not quantize its weight"
    n = w.shape[c.out_axis]
    s = wq.scale.float().reshape(-1)
    if s.numel() not in (1, n) or (s.numel() > 1 and wq.axis % w.dim() != c.out_axis):
        return "the model quantizes its weight along another axis than the output channel"
    shape = [1] * w.dim()
    shape[c.out_axis] = -1
    if wq.q.shape != w.shape or wq.q.dtype != torch.int8 or not torch.equal(w, wq.q.float() * s.reshape(shape)):
        return "its weight is no longer the int8 constant the model dequantizes (a pass changed it)"
    return wq.q.movedim(c.out_axis, 0).contiguous(), s.expand(n).clone()


def _refusal(net: Network, c: Candidate, scales: QuantScales, qtype: QType) -> str | None:
    if c.x not in scales.activations:
        return "the model does not quantize its input" if scales.qdq else "its input has no scale"
    if qtype.integer and c.k * qtype.qmax * qtype.qmax > INT32_MAX:
        return f"its reduction length {c.k} could overflow int32 accumulation"
    return None


def _reads_quantized(c: Candidate, y: str, residual: bool) -> bool:
    """`c`'s quantized form can read `y` in the quantized type: only as its input, or (`residual`) its residual."""
    slots = {0} | ({FUSED_RESIDUAL} if residual and c.residual == y else set())
    return all(k in slots for k, n in enumerate(c.layer.inputs) if n == y)


def _max_pool_between(net: Network, consumers: dict, y: str, scales: QuantScales) -> Layer | None:
    """The MaxPool that is `y`'s only reader, when a calibrated build may run it on the quantized type: the
    producer then requantizes with the pool output's scale (round and a positive scale are monotonic, so
    Q(max(y)) = max(Q(y)) up to the producer's multiply-by-1/scale rounding) and the pool reads int8 / fp8."""
    readers = consumers.get(y, [])
    if scales.qdq or y in net.outputs or len(readers) != 1 or readers[0].kind != "MaxPool":
        return None
    pool = readers[0]
    indices = pool.outputs[1] if len(pool.outputs) > 1 else ""
    return None if indices and (consumers.get(indices) or indices in net.outputs) else pool


def apply_int8(net: Network, scales: QuantScales, keep_float: set[str] = frozenset(),
               qtype: QType = INT8) -> Int8Result:
    """Quantize every layer that can be (module docstring) to `qtype`, in place; layers in `keep_float` stay
    float. `scales` are `qtype`'s (scheme.for_qtype)."""
    result = Int8Result()
    chosen: dict[str, tuple[Candidate, torch.Tensor, torch.Tensor]] = {}
    for name, c in candidates(net).items():
        why = "kept in float on request" if name in keep_float else _refusal(net, c, scales, qtype)
        weight = None if why else _weight(net, c, scales, qtype)
        if isinstance(weight, str):
            why = weight
        if why:
            result.layers[name] = {"kind": c.layer.kind, "precision": "float", "reason": why}
        else:
            chosen[name] = (c, *weight)
    consumers = net.consumers()

    def quantized_readers(y: str) -> bool:
        readers = consumers.get(y, [])
        return y not in net.outputs and y in scales.activations and bool(readers) and all(
            r.name in chosen and _reads_quantized(chosen[r.name][0], y, not scales.qdq) for r in readers)

    out_scales = {}  # quantized layer → the scale it requantizes its output with
    for name, (c, _, _) in chosen.items():
        y = c.layer.outputs[0]
        if quantized_readers(y):
            out_scales[name] = scales.activations[y].scale
        elif (pool := _max_pool_between(net, consumers, y, scales)) and quantized_readers(pool.outputs[0]):
            out_scales[name] = scales.activations[pool.outputs[0]].scale  # max commutes with quantizing
            for t in (y, pool.outputs[0]):
                net.tensors[t].dtype = qtype.dtype
    rewrite = _Rewrite(net, scales, qtype)
    for layer in net.layers:
        if layer.name not in chosen:
            rewrite.keep(layer)
            continue
        c, q, s = chosen[layer.name]
        rewrite.quantized(c, q, s, out_scales.get(layer.name))
        r = scales.activations[c.x]
        result.layers[layer.name] = {"kind": layer.kind, "precision": qtype.label, "scale_source": r.source,
                                     "x_scale": r.scale, "output": qtype.label if layer.name in out_scales else "fp32"}
        if c.residual:
            result.layers[layer.name]["residual"] = qtype.label if net.tensors[c.residual].dtype is qtype.dtype \
                else "fp32"
    net.layers = rewrite.layers
    eliminate_dead(net, PassContext())
    verify_network(net)
    result.quantize_layers, result.fake_quant = rewrite.quantizes, rewrite.fake_quant
    return result


class _Rewrite:
    """One walk over the layers that emits the quantized ones and their QuantizeLinear layers."""

    def __init__(self, net: Network, scales: QuantScales, qtype: QType):
        self.net, self.scales, self.qtype = net, scales, qtype
        self.layers: list[Layer] = []
        self.int8: dict[str, str] = {}   # float tensor → its QuantizeLinear output
        self.fake: dict[str, str] = {}   # float tensor → its Q → DQ value (explicit Q/DQ models)
        self.consts: dict[str, str] = {}  # tensor → the constant holding its scale
        self.quantizes = self.fake_quant = 0

    def keep(self, layer: Layer) -> None:
        if self.scales.qdq:
            layer.inputs = [self.as_written(n) for n in layer.inputs]
        self.layers.append(layer)

    def as_written(self, name: str) -> str:
        """A tensor the model quantized, as a float reader sees it in the model: DequantizeLinear(QuantizeLinear(·))."""
        if not name or name not in self.scales.activations or self.net.tensors[name].dtype is not F32:
            return name
        if name not in self.fake:
            net, xq = self.net, self.quantize(name)
            out = net.unique_name(f"{name}_dq")
            net.add_tensor(out, F32, net.tensors[name].shape)
            self.layers.append(Layer(net.unique_name(f"{name}_dequantize"), "DequantizeLinear",
                                     [xq, self.scale_const(name)], [out], dict(DQ_ATTRS), origin=[]))
            self.fake[name] = out
            self.fake_quant += 1
        return self.fake[name]

    def scale_const(self, name: str) -> str:
        if name not in self.consts:
            self.consts[name] = const = self.net.unique_name(f"{name}_scale")
            self.net.add_constant(const, torch.tensor(self.scales.activations[name].scale, dtype=torch.float32))
        return self.consts[name]

    def quantize(self, name: str) -> str:
        """`name` quantized: itself when a quantized layer already writes it so, else an explicit QuantizeLinear."""
        net, qt = self.net, self.qtype
        if net.tensors[name].dtype is qt.dtype:
            return name
        if name not in self.int8:
            out = net.unique_name(f"{name}_{qt.label}")
            net.add_tensor(out, qt.dtype, net.tensors[name].shape)
            self.layers.append(Layer(net.unique_name(f"{name}_quantize"), "QuantizeLinear",
                                     [name, self.scale_const(name)], [out], Q_ATTRS | {"output_dtype": qt.dtype},
                                     origin=[]))
            self.int8[name] = out
            self.quantizes += 1
        return self.int8[name]

    def quantized(self, c: Candidate, q: torch.Tensor, s: torch.Tensor, out_scale: float | None) -> None:
        net, layer, qt = self.net, c.layer, self.qtype
        xq = self.quantize(c.x)
        wq = net.unique_name(f"{c.weight}_{qt.label}")
        net.add_constant(wq, q)
        ws = net.unique_name(f"{c.weight}_wscale")
        net.add_constant(ws, s.float().contiguous())
        bias = c.bias
        if isinstance(bias, torch.Tensor):
            name = net.unique_name(f"{layer.name}.bias")
            net.add_constant(name, bias.float().contiguous())
            bias = name
        inputs = [xq, wq, ws, bias or ""]
        attrs = c.attrs | {"x_scale": self.scales.activations[c.x].scale, "out_scale": out_scale}
        if c.residual:
            inputs.append(self.as_written(c.residual) if self.scales.qdq else c.residual)
            if net.tensors[c.residual].dtype is qt.dtype:  # its producer, earlier in the walk, writes it quantized
                attrs["res_scale"] = self.scales.activations[c.residual].scale
        if qt is not INT8:
            attrs["qtype"] = qt.name
        if out_scale is not None:
            net.tensors[layer.outputs[0]].dtype = qt.dtype
        self.layers.append(Layer(layer.name, "QuantConv" if c.conv else "QuantGemm", inputs, list(layer.outputs),
                                 attrs, precision=qt.dtype, origin=layer.origin))
