"""Reference implementations of the fused layer kinds the fuse_* passes produce.

Each is written as the composition of the references of the kinds it replaces, so its semantics
(dtypes, broadcasting, rounding of every step) stay defined in one place; GPU tactics implement
the fused kinds in one kernel and are checked against these.

Activations of FusedConv / FusedGemm (`activation`, `activation_params`):
  "none", "Relu", "Sigmoid", "Tanh", "HardSwish", "SiLU" (x·sigmoid(x)), "Gelu" (exact, erf),
  "GeluTanh" (tanh approximation): no params; "LeakyRelu": [alpha]; "Clip": [min, max]
  (None: unbounded on that side; ReLU6 is [0.0, 6.0]).
"""

from __future__ import annotations

import math

import torch

from kiln.kinds.registry import (BOOL, DTYPE, FLOAT, INT, INTS, KINDS, NONE, STR, AttrSpec, attr_problem, kind,
                                  list_of, run_reference)


def _ref(kind_name: str, inputs: list, attrs: dict | None = None) -> torch.Tensor:
    return run_reference(kind_name, inputs, attrs or {})[0]


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def activate(y: torch.Tensor, name: str, params: list) -> torch.Tensor:
    """Apply the named epilogue activation (module docstring) through the activation kinds' references."""
    if name == "none":
        return y
    if name == "SiLU":
        return _ref("Mul", [y, _ref("Sigmoid", [y])])
    if name == "Clip":
        lo, hi = params
        return _ref("Clip", [y, None if lo is None else _scalar(lo, y), None if hi is None else _scalar(hi, y)])
    if name == "LeakyRelu":
        return _ref("LeakyRelu", [y], {"alpha": params[0]})
    if name in ("Gelu", "GeluTanh"):
        return _ref("Gelu", [y], {"approximate": "tanh" if name == "GeluTanh" else "none"})
    return _ref(name, [y])


@kind("FusedConv", attrs={"activation": STR.req, "activation_params": list_of(FLOAT | NONE).req, "auto_pad": STR,
                          "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS.req, "pads": INTS.req,
                          "residual": BOOL, "strides": INTS.req})
def fused_conv(inputs, attrs):
    """Conv(X, W, B) (+ R when `residual`) then `activation`. Inputs: X, W, optional B, optional R
    (same shape as the conv output). attrs: Conv's, plus residual, activation, activation_params."""
    x, w, b, r = (list(inputs) + [None] * 4)[:4]
    y = _ref("Conv", [x, w, b], attrs)
    if r is not None:
        y = _ref("Add", [y, r])
    return activate(y, attrs["activation"], attrs["activation_params"])


@kind("FusedGemm", attrs={"activation": STR.req, "activation_params": list_of(FLOAT | NONE).req, "trans_b": BOOL.req})
def fused_gemm(inputs, attrs):
    """A @ W (+ bias) then `activation`. Inputs: A (N-D, [..., K]), W (2-D: [K, N], or [N, K] when
    `trans_b`), optional bias [N]. attrs: trans_b, activation, activation_params."""
    a, w, bias = (list(inputs) + [None] * 3)[:3]
    y = _ref("MatMul", [a, w.t() if attrs["trans_b"] else w])
    if bias is not None:
        y = _ref("Add", [y, bias])
    return activate(y, attrs["activation"], attrs["activation_params"])


@kind("FusedAttention", attrs={"mask_fill": FLOAT | NONE, "nan_to_zero": BOOL, "q_dtype": DTYPE,
                               "q_scale": FLOAT | NONE, "scale": (FLOAT | NONE).req, "scale_on": STR.req})
def fused_attention(inputs, attrs):
    """Softmax(scale · Q @ Kᵀ + mask, last axis) @ V, as MatMul → scale → Add → Softmax → MatMul.

    Inputs: Q [..., Sq, D], KT (the key already transposed, [..., D, Skv], as exporters write it),
    V [..., Skv, Dv], optional mask (broadcast like Add): additive if float, else a keep mask, where a zero or False
    adds mask_fill (attr; None: -inf) and any other value 0 (passes/attention_keep_mask.py). attrs: scale (float,
    or None: 1/√D of Q's last dim at run time); scale_on "scores" (the product is multiplied by scale) or "qk"
    (Q and KT are each multiplied by √scale first, as torch's SDPA decomposition writes it);
    nan_to_zero (optional, default False): NaN probabilities, as a row masked all -inf gives, become 0
    (SDPA's safe softmax) before the product with V. With q_scale (quant/fold_quantize.py) the output is
    QuantizeLinear(Y, q_scale) to q_dtype (int8, per tensor, saturating).
    """
    q, kt, v, mask = (list(inputs) + [None] * 4)[:4]
    scale = attrs["scale"] if attrs["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    if attrs["scale_on"] == "qk":
        root = _scalar(math.sqrt(scale), q)
        q, kt = _ref("Mul", [q, root]), _ref("Mul", [kt, root])
    scores = _ref("MatMul", [q, kt])
    if attrs["scale_on"] == "scores":
        scores = _ref("Mul", [scores, _scalar(scale, scores)])
    if mask is not None and mask.dtype.is_floating_point:
        scores = _ref("Add", [scores, mask])
    elif mask is not None:
        fill = attrs.get("mask_fill")
        scores = _ref("Add", [scores, _ref("Where", [mask != 0, _scalar(0.0, scores),
                                                     _scalar(-math.inf if fill is None else fill, scores)])])
    p = _ref("Softmax", [scores], {"axis": -1})
    if attrs.get("nan_to_zero"):
        p = _ref("Where", [_ref("IsNaN", [p]), _scalar(0.0, p), p])
    y = _ref("MatMul", [p, v])
    if attrs.get("q_scale") is None:
        return y
    return _quantize(y, attrs["q_scale"], attrs["q_dtype"])


@kind("AddLayerNorm", attrs={"axis": INT, "epsilon": FLOAT, "q_dtype": DTYPE, "q_scale": FLOAT | NONE,
                             "stash_type": INT})
def add_layer_norm(inputs, attrs):
    """S = A + B (same shapes), Y = LayerNormalization(S, scale, bias). Outputs: Y, S, and with attr q_scale
    (quant/fold_quantize.py) Y_q = QuantizeLinear(Y, q_scale) to q_dtype (int8 / fp8, per tensor, saturating), or
    QuantizeLinear(Y · q_mul) with a fifth input q_mul (SmoothQuant's 1/s per channel, in Y's dtype).
    attrs: LayerNormalization's (axis, epsilon, stash_type)."""
    a, b, scale, bias, q_mul = (list(inputs) + [None] * 5)[:5]
    s = _ref("Add", [a, b])
    y = _ref("LayerNormalization", [s, scale, bias], {k: v for k, v in attrs.items() if not k.startswith("q_")})
    if attrs.get("q_scale") is None:
        return y, s
    q_in = y if q_mul is None else _ref("Mul", [y, q_mul.to(y.dtype)])
    return y, s, _quantize(q_in, attrs["q_scale"], attrs["q_dtype"])


@kind("EmbedLayerNorm", attrs={"axis": INT, "epsilon": FLOAT, "stash_type": INT})
def embed_layer_norm(inputs, attrs):
    """Y = LayerNormalization(((T0[I0] + T1[I1]) + T2[I2]) + C, scale, bias) over the last dim: a transformer's
    token, segment and position lookups (Gathers along axis 0 of [V, H] tables) summed left to right with a
    constant C, each broadcast over the leading dims. Inputs: I0, T0, I1, T1, I2, T2, C, scale, bias (all but the
    first term and scale may be absent). attrs: LayerNormalization's (axis: the last)."""
    i0, t0, i1, t1, i2, t2, c, scale, bias = (list(inputs) + [None] * 9)[:9]
    s = _ref("Gather", [t0, i0], {"axis": 0})
    for ids, table in ((i1, t1), (i2, t2)):
        if table is not None:
            s = _ref("Add", [s, _ref("Gather", [table, ids], {"axis": 0})])
    if c is not None:
        s = _ref("Add", [s, c])
    return (_ref("LayerNormalization", [s, scale, bias], attrs),)


def _quantize(y, scale: float, dtype):
    """QuantizeLinear(y, scale) to `dtype` as kiln inserts it: per tensor, no zero point, saturating."""
    q_attrs = {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": dtype, "precision": None}
    return _ref("QuantizeLinear", [y, torch.tensor(scale, dtype=torch.float32)], q_attrs)


def _program(value) -> bool:
    """A PointwiseChain program: steps [kind, operand numbers, [name, value, ...]] of registered kinds, each step's
    attributes ones its kind takes."""
    return isinstance(value, (list, tuple)) and all(_step(s) for s in value)


def _step(step) -> bool:
    if not isinstance(step, (list, tuple)) or len(step) != 3:
        return False
    kind_name, refs, flat = step
    return (isinstance(kind_name, str) and kind_name in KINDS and isinstance(refs, (list, tuple))
            and all(r is None or isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in refs)
            and isinstance(flat, (list, tuple)) and len(flat) % 2 == 0 and all(isinstance(n, str) for n in flat[::2])
            and attr_problem(kind_name, dict(zip(flat[::2], flat[1::2]))) is None)


PROGRAM = AttrSpec("a list of steps [kind, operand numbers, [name, value, ...]]", _program)


@kind("PointwiseChain", attrs={"program": PROGRAM.req})
def pointwise_chain(inputs, attrs):
    """A tree of elementwise layers run as one. attrs: program, a list of steps [kind, refs, flat_attrs].

    Values are numbered: value i < len(inputs) is input i, value len(inputs) + j is step j's result.
    `refs` lists a step's operands by value number (None: an omitted optional input); `flat_attrs`
    is [name, value, name, value, ...] of the step's attributes. The last step's value is the output.
    """
    values = list(inputs)
    for step_kind, refs, flat in attrs["program"]:
        step_attrs = dict(zip(flat[::2], flat[1::2]))
        values.append(_ref(step_kind, [None if r is None else values[r] for r in refs], step_attrs))
    return values[-1]


@kind("StridedView", attrs={"shape": INTS.req, "strides": INTS.req, "offset": INT.req})
def strided_view(inputs, attrs):
    """A chain of layout layers (Transpose, Reshape, Squeeze, Gather of one index, ...) as one strided view of its
    input's elements in row-major order: y[i] = x.flat[offset + Σ i_k · strides_k] (passes/collapse_views.py)."""
    x = inputs[0].contiguous()
    return x.as_strided(attrs["shape"], attrs["strides"], x.storage_offset() + attrs["offset"]).clone()
