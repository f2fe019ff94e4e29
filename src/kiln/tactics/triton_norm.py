"""LayerNormalization, AddLayerNorm (residual add + LayerNorm in one kernel), EmbedLayerNorm (embedding lookups summed
+ LayerNorm in one kernel) and Softmax over the last dim through the generated Triton row kernels."""

from __future__ import annotations

import math

from kiln.ir import DType
from kiln.kernels import layernorm, softmax
from kiln.kernels.common import MAX_ROW_BLOCK, row_configs
from kiln.tactics.common import first, rank
from kiln.tactics.int8_lowering import fp8_device_reason
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import io_reason


def _width(spec: LayerSpec) -> int:
    n = spec.inputs[0].shape[-1] if spec.inputs[0].shape else None
    return n if isinstance(n, int) else 1024


def _configs(spec: LayerSpec, device, level: int):
    return row_configs(_width(spec), level)


def _supports_ln(spec: LayerSpec, device) -> str | None:
    x = spec.inputs[0]
    if any(o.dtype is not None for o in spec.outputs[1:]):
        return "Mean / InvStdDev outputs are requested"
    r = rank(x)
    if not r:
        return "input rank unknown or scalar"
    if spec.attrs.get("axis", -1) % r != r - 1:
        return "normalizes over more than the last dim"
    n = x.shape[-1]
    if not isinstance(n, int):
        return "last dim is not static"
    for p in spec.inputs[1:3]:
        if p is not None and (not p.static or not p.shape or p.shape[-1] != n or math.prod(p.shape) != n):
            return "scale / bias do not hold exactly the last dim's values"
    if spec.attrs.get("stash_type", 1) != 1:
        return "stash_type other than float32"
    return io_reason(spec, [*spec.inputs[:3], spec.outputs[0]], device)


def _compile_ln(spec: LayerSpec, config, device):
    eps = spec.attrs.get("epsilon", 1e-5)

    def run(inputs, out=None):
        return [layernorm.layer_norm(inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None, eps, config,
                                     first(out))]

    return run


def _supports_softmax(spec: LayerSpec, device) -> str | None:
    if spec.attrs.get("flatten"):
        return "opset < 13 Softmax coerces the input to 2-D"
    r = rank(spec.inputs[0])
    if not r:
        return "input rank unknown or scalar"
    if spec.attrs.get("axis", -1) not in (-1, r - 1):
        return "softmax over a dim other than the last"
    return io_reason(spec, [spec.inputs[0], spec.outputs[0]], device)


def _compile_softmax(spec: LayerSpec, config, device):
    return lambda inputs, out=None: [softmax.softmax(inputs[0], config, first(out))]


def _supports_add_ln(spec: LayerSpec, device) -> str | None:
    """AddLayerNorm: A and B of one shape (leading dims may be symbolic: the grid is their row count at run time),
    rows that fit one block, LayerNorm's own conditions."""
    a, b = spec.inputs[:2]
    if a is None or b is None or a.shape is None or a.shape != b.shape:
        return "A and B shapes differ or are unknown"
    if rank(a) and isinstance(a.shape[-1], int) and a.shape[-1] > MAX_ROW_BLOCK:
        return f"rows wider than {MAX_ROW_BLOCK} values"
    ln = LayerSpec(spec.name, "LayerNormalization", {k: v for k, v in spec.attrs.items() if not k.startswith("q_")},
                   (a, *spec.inputs[2:4]), spec.outputs[:1])
    why = _supports_ln(ln, device) or io_reason(spec, [b, spec.outputs[0]], device)
    if why is None and spec.attrs.get("q_scale") is not None and spec.attrs["q_dtype"] is DType.FP8E4M3:
        return fp8_device_reason(device)
    return why


def _configs_add_ln(spec: LayerSpec, device, level: int):
    """The row configs, with blocks of 2-8 rows a program after the first (level ≥ 2): 8192 fp16 rows of 768 took
    9.3 µs one a program and 7.5 µs four a program; with the folded int8 output one a program stayed fastest (H200)."""
    one = [c for c in row_configs(_width(spec), level) if c["BLOCK"] >= _width(spec)]
    if level <= 1:
        return one
    block = one[0]["BLOCK"]
    many = [{"BLOCK": block, "num_warps": w, "ROWS": r} for r, w in ((4, 4), (8, 8), (2, 4), (4, 8))
            if r * block <= 8192]
    return one[:1] + many + one[1:]


def _compile_add_ln(spec: LayerSpec, config, device):
    eps = spec.attrs.get("epsilon", 1e-5)
    want_sum = len(spec.outputs) > 1 and spec.outputs[1] is not None and spec.outputs[1].dtype is not None
    q_scale, q_dtype = spec.attrs.get("q_scale"), spec.attrs.get("q_dtype")
    quant = dict(q_scale=q_scale, q_dtype=q_dtype.torch) if q_scale is not None else {}

    def run(inputs, out=None):
        bias = inputs[3] if len(inputs) > 3 else None
        q_mul = inputs[4] if len(inputs) > 4 else None
        outs = layernorm.add_layer_norm(inputs[0], inputs[1], inputs[2], bias, eps, config, want_sum, out or (),
                                        q_mul=q_mul, **quant)
        return list(outs)

    return run


def _supports_embed_ln(spec: LayerSpec, device) -> str | None:
    """EmbedLayerNorm: index tensors of int32 / int64, tables, constant, scale and bias of the output's float dtype,
    rows that fit one block, LayerNorm's own conditions."""
    ids, tables = spec.inputs[0:6:2], spec.inputs[1:6:2]
    if any(i is not None and i.dtype not in (DType.INT64, DType.INT32) for i in ids):
        return "indices are not int32 / int64"
    y = spec.outputs[0]
    n = y.shape[-1] if rank(y) else None
    if not isinstance(n, int) or n > MAX_ROW_BLOCK:
        return f"last dim unknown or wider than {MAX_ROW_BLOCK} values"
    if spec.attrs.get("stash_type", 1) != 1:
        return "stash_type other than float32"
    for p in spec.inputs[7:9]:
        if p is not None and (not p.static or math.prod(p.shape) != n):
            return "scale / bias do not hold exactly the last dim's values"
    return io_reason(spec, [t for t in (*tables, *spec.inputs[6:9]) if t is not None] + [y], device)


def _configs_embed_ln(spec: LayerSpec, device, level: int):
    n = spec.outputs[0].shape[-1]
    one = [c for c in row_configs(n, level) if c["BLOCK"] >= n]
    return one[:1] + [dict(one[0], ROWS=4, num_warps=4)] + one[1:] if level >= 2 else one


def _compile_embed_ln(spec: LayerSpec, config, device):
    eps = spec.attrs.get("epsilon", 1e-5)

    def run(inputs, out=None):
        i0, t0, i1, t1, i2, t2, c, scale, bias = (list(inputs) + [None] * 9)[:9]
        terms = [(i, t) for i, t in ((i0, t0), (i1, t1), (i2, t2)) if t is not None]
        return [layernorm.embed_layer_norm(terms, c, scale, bias, eps, config, first(out))]

    return run


register(Tactic("triton_layernorm", ("LayerNormalization",), _compile_ln, _supports_ln, _configs, priority=20,
                writes_out=True))
register(Tactic("triton_softmax", ("Softmax",), _compile_softmax, _supports_softmax, _configs, priority=20,
                writes_out=True))
register(Tactic("triton_add_layernorm", ("AddLayerNorm",), _compile_add_ln, _supports_add_ln, _configs_add_ln,
                priority=20, writes_out=True))
register(Tactic("triton_embed_layernorm", ("EmbedLayerNorm",), _compile_embed_ln, _supports_embed_ln,
                _configs_embed_ln, priority=20, writes_out=True))
