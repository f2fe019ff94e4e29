"""Reference implementations of elementwise arithmetic, math, comparison, logic and bitwise kinds.

Torch kernels do not cover uint16/uint32/uint64 for most ops, so integer ops go through a
*carry*: uint16/uint32 values widened to int64, uint64 bits reinterpreted as int64 (exact for
add/sub/mul/bitwise/shift-left; comparisons, division and right shifts correct for the sign bit).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from kiln.errors import UnsupportedOpError
from kiln.kinds.registry import FLOAT, INT, INTS, NONE, STR, kind

_WIDENED = (torch.uint16, torch.uint32)
_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
_I64_MIN = -(2**63)


def _carry(t: torch.Tensor) -> torch.Tensor:
    """An integer tensor in a dtype torch computes on (see module docstring)."""
    if t.dtype in _WIDENED:
        return t.to(torch.int64)
    return t.view(torch.int64) if t.dtype == torch.uint64 else t


def _uncarry(c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Back from the carry to `dtype`, wrapping modulo 2**bits as ONNX integer arithmetic does."""
    return c.view(dtype) if dtype == torch.uint64 else c.to(dtype)


def _key(t: torch.Tensor) -> torch.Tensor:
    """An order-preserving signed (or float) tensor for comparisons."""
    c = _carry(t)
    return c ^ _I64_MIN if t.dtype == torch.uint64 else c


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The same bits as a signed integer dtype torch supports (for where/bitwise)."""
    return t.view(_SIGNED_VIEW[t.dtype]) if t.dtype in _SIGNED_VIEW else t


def _via_carry(op):
    """Apply a dtype-preserving integer op through the carry."""

    def run(a, b):
        return _uncarry(op(_carry(a), _carry(b)), a.dtype)

    return run


def _shr_logical(c: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Logical right shift of int64 bits (uint64 semantics)."""
    once = (c >> 1) & (2**63 - 1)
    return torch.where(n == 0, c, once >> (n - 1).clamp(min=0))


def _divmod_u64(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsigned 64-bit quotient and remainder on int64 bits (Hacker's Delight, divlu by halving)."""
    a, b = torch.broadcast_tensors(a, b)
    big = b < 0  # divisor >= 2**63: quotient is 0 or 1
    q_big = ((a ^ _I64_MIN) >= (b ^ _I64_MIN)).to(torch.int64)
    safe_b = torch.where(big, torch.ones_like(b), b)
    q = (_shr_logical(a, torch.ones_like(a)) // safe_b) << 1
    r = a - q * safe_b
    fix = (r ^ _I64_MIN) >= (safe_b ^ _I64_MIN)
    q = torch.where(fix, q + 1, q)
    r = torch.where(fix, r - safe_b, r)
    return torch.where(big, q_big, q), torch.where(big, a - q_big * b, r)


def _div(a, b):
    if a.dtype.is_floating_point:
        return a / b
    if a.dtype == torch.uint64:
        return _divmod_u64(a.view(torch.int64), b.view(torch.int64))[0].view(torch.uint64)
    return _uncarry(torch.div(_carry(a), _carry(b), rounding_mode="trunc"), a.dtype)


def _compare(op):
    def run(a, b):
        if isinstance(a, np.ndarray):  # STRING tensors
            return torch.from_numpy(np.asarray(op(a, b), dtype=bool))
        return op(_key(a), _key(b))

    return run


def _maximum(a, b):
    return torch.where(_key(a) >= _key(b), _bits(a), _bits(b)).view(a.dtype) if a.dtype in _SIGNED_VIEW \
        else torch.maximum(a, b)


def _minimum(a, b):
    return torch.where(_key(a) <= _key(b), _bits(a), _bits(b)).view(a.dtype) if a.dtype in _SIGNED_VIEW \
        else torch.minimum(a, b)


def _bitwise(op):
    def run(a, b):
        return op(_bits(a), _bits(b)).view(a.dtype)

    return run


_BINARY = {
    "Add": _via_carry(torch.add), "Sub": _via_carry(torch.sub), "Mul": _via_carry(torch.mul), "Div": _div,
    "Equal": _compare(lambda a, b: a == b), "Less": _compare(lambda a, b: a < b),
    "Greater": _compare(lambda a, b: a > b), "LessOrEqual": _compare(lambda a, b: a <= b),
    "GreaterOrEqual": _compare(lambda a, b: a >= b),
    "And": torch.logical_and, "Or": torch.logical_or, "Xor": torch.logical_xor,
    "BitwiseAnd": _bitwise(torch.bitwise_and), "BitwiseOr": _bitwise(torch.bitwise_or),
    "BitwiseXor": _bitwise(torch.bitwise_xor),
}


def _binary(op):
    def ref(inputs, attrs):
        return op(inputs[0], inputs[1])

    return ref


for _name, _op in _BINARY.items():
    kind(_name, attrs={})(_binary(_op))


_UNARY = {
    "Ceil": torch.ceil, "Floor": torch.floor, "Round": torch.round, "Reciprocal": torch.reciprocal,
    "Sqrt": torch.sqrt, "Exp": torch.exp, "Log": torch.log, "Sin": torch.sin, "Cos": torch.cos,
    "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan, "Sinh": torch.sinh,
    "Cosh": torch.cosh, "Asinh": torch.asinh, "Acosh": torch.acosh, "Atanh": torch.atanh, "Erf": torch.erf,
    "IsNaN": torch.isnan, "Not": torch.logical_not,
    "BitwiseNot": lambda x: torch.bitwise_not(_bits(x)).view(x.dtype),
    "Neg": lambda x: _uncarry(torch.neg(_carry(x)), x.dtype),
    "Abs": lambda x: x if x.dtype in _SIGNED_VIEW or x.dtype == torch.uint8 else torch.abs(x),
    "Sign": lambda x: (x != 0).to(x.dtype) if x.dtype in _SIGNED_VIEW else torch.sign(x),
}


def _unary(op):
    def ref(inputs, attrs):
        return op(inputs[0])

    return ref


for _name, _op in _UNARY.items():
    kind(_name, attrs={"consumed_inputs": INTS})(_unary(_op))


@kind("Identity", attrs={})
def identity(inputs, attrs):
    """Any runtime value (tensor, string array, sequence list), returned as the single output."""
    return [inputs[0]]


@kind("IsInf", attrs={"detect_negative": INT, "detect_positive": INT})
def is_inf(inputs, attrs):
    x = inputs[0]
    out = torch.zeros_like(x, dtype=torch.bool)
    if attrs.get("detect_positive", 1):
        out |= x == float("inf")
    if attrs.get("detect_negative", 1):
        out |= x == float("-inf")
    return out


@kind("Pow", attrs={})
def pow_(inputs, attrs):
    """x ** y in the type of x: integer bases with float exponents go through float64, as ORT does."""
    x, y = inputs
    if x.dtype.is_floating_point:
        wide = torch.promote_types(torch.promote_types(x.dtype, y.dtype), torch.float32)
        return torch.pow(x.to(wide), y.to(wide)).to(x.dtype)
    if y.dtype.is_floating_point:
        return torch.pow(x.double(), y.double()).to(x.dtype)
    return torch.pow(x, y.to(x.dtype))


@kind("Mod", attrs={"fmod": INT})
def mod(inputs, attrs):
    """fmod=1: sign of the dividend (C fmod); fmod=0: sign of the divisor (Python %)."""
    a, b = inputs
    if a.dtype == torch.uint64:
        return _divmod_u64(a.view(torch.int64), b.view(torch.int64))[1].view(torch.uint64)
    op = torch.fmod if attrs.get("fmod", 0) else torch.remainder
    return _uncarry(op(_carry(a), _carry(b)), a.dtype)


@kind("BitShift", attrs={"direction": STR.req})
def bit_shift(inputs, attrs):
    """Shifts of unsigned integers; bits shifted past the width are lost."""
    x, n = _carry(inputs[0]), _carry(inputs[1])
    if attrs["direction"] == "LEFT":
        return _uncarry(x << n, inputs[0].dtype)
    if inputs[0].dtype == torch.uint64:
        return _shr_logical(*torch.broadcast_tensors(x, n)).view(torch.uint64)
    return _uncarry(x >> n, inputs[0].dtype)


def _variadic(op):
    def ref(inputs, attrs):
        return functools.reduce(op, inputs)

    return ref


kind("Max", attrs={"consumed_inputs": INTS})(_variadic(_maximum))
kind("Min", attrs={"consumed_inputs": INTS})(_variadic(_minimum))
kind("Sum", attrs={"consumed_inputs": INTS})(_variadic(_BINARY["Add"]))


@kind("Mean", attrs={"consumed_inputs": INTS})
def mean(inputs, attrs):
    return functools.reduce(torch.add, inputs) / len(inputs)


@kind("Clip", attrs={"consumed_inputs": INTS, "max": FLOAT, "min": FLOAT})
def clip(inputs, attrs):
    """min(max(x, lo), hi); bounds come from inputs 1 and 2 (opset >= 11) or attributes (older)."""
    x = inputs[0]
    lo = inputs[1] if len(inputs) > 1 else None
    hi = inputs[2] if len(inputs) > 2 else None
    if lo is None and "min" in attrs:
        lo = torch.tensor(attrs["min"], dtype=x.dtype, device=x.device)
    if hi is None and "max" in attrs:
        hi = torch.tensor(attrs["max"], dtype=x.dtype, device=x.device)
    if lo is not None:
        x = _maximum(x, lo.to(x.device))
    if hi is not None:
        x = _minimum(x, hi.to(x.device))
    return x


@kind("Where", attrs={})
def where(inputs, attrs):
    cond, x, y = inputs
    if isinstance(x, np.ndarray):
        return [np.where(cond.cpu().numpy(), x, y)]
    return torch.where(cond, _bits(x), _bits(y)).view(x.dtype)


@kind("Dropout", attrs={"consumed_inputs": INTS, "is_test": INT, "ratio": FLOAT, "seed": INT | NONE})
def dropout(inputs, attrs):
    """Identity (mask all true) unless training_mode is true with ratio > 0; then the mask is drawn from
    numpy's RandomState(seed), as ONNX's reference does. Without a seed that is random: rejected."""
    x = inputs[0]
    ratio = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("ratio", 0.5)
    training = len(inputs) > 2 and inputs[2] is not None and bool(inputs[2])
    ratio = float(ratio)
    if not training or ratio == 0:
        return x, torch.ones_like(x, dtype=torch.bool)
    if attrs.get("seed") is None:
        raise UnsupportedOpError("Dropout in training mode with ratio > 0 and no seed is random; kiln runs "
                                 "inference only: set training_mode to false or give the node a seed")
    keep = np.random.RandomState(attrs["seed"]).uniform(0, 1.0, tuple(x.shape)) >= ratio
    mask = torch.from_numpy(keep).to(x.device)
    return (x * mask * (1.0 / (1.0 - ratio))).to(x.dtype), mask
