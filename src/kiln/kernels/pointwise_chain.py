"""A PointwiseChain (passes/fuse_pointwise_chain.py) as one generated Triton kernel: every step of its program is one
line of the kernel's source, so the chain reads its inputs once and writes its output once, where its reference runs
a torch kernel per step.

Each float step computes in fp32 and rounds to the dtype the reference's step gives (`dtypes`: torch's type
promotion), so results follow the reference step by step. Inputs are whole tensors of the output's shape, single
values, or tensors that broadcast to it (read through their strides, 0 along a broadcast dim). The source is
generated per program, dtypes and input forms and held in `linecache` under a name of its own (as dataclasses does
for the code it generates), where Triton reads it back.
"""

from __future__ import annotations

import functools
import hashlib
import linecache
import math

import torch
import triton
import triton.language as tl

from kiln.kernels import common
from kiln.kernels.common import pdl_args
from kiln.kernels.out_buffer import take
from kiln.kernels.pointwise import CONFIGS, OPS, resolve

TL = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
      torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16", torch.int8: "tl.int8",
      torch.uint8: "tl.uint8", torch.bool: "tl.int1"}
# kind -> its expression over operands {a}, {b} (each already in the step's compute type)
ARITHMETIC = {"Add": "{a} + {b}", "Sub": "{a} - {b}", "Mul": "{a} * {b}", "Div": "{a} / {b}",
              "Max": "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
              "Min": "tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
              "Neg": "-{a}", "Abs": "tl.abs({a})", "Exp": "tl.exp({a})", "Log": "tl.log({a})",
              "Sqrt": "tl.sqrt({a})", "Reciprocal": "1.0 / {a}", "Floor": "tl.floor({a})", "Ceil": "tl.ceil({a})",
              "Erf": "erf({a})"}
COMPARE = {"Equal": "{a} == {b}", "Less": "{a} < {b}", "Greater": "{a} > {b}", "LessOrEqual": "{a} <= {b}",
           "GreaterOrEqual": "{a} >= {b}", "And": "{a} & {b}", "Or": "{a} | {b}", "Xor": "{a} ^ {b}",
           "Not": "{a} == 0"}
FLOAT_ONLY = {"Div", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Erf", *OPS}
STEP_KINDS = set(ARITHMETIC) | set(COMPARE) | set(OPS) | {"Where", "Cast", "Clip"}


def step_attrs(step: list) -> dict:
    """A program step's attributes as a dict (the program holds them flat: [name, value, ...])."""
    return dict(zip(step[2][::2], step[2][1::2]))


def reason(program: list, dtypes: list[torch.dtype]) -> str | None:
    """Why the chain cannot be one generated kernel, or None. `dtypes`: the inputs' then each step's result's."""
    if any(d not in TL for d in dtypes):
        return "a value of a type the generated kernel does not hold (float64, complex, fp8)"
    first = len(dtypes) - len(program)
    for k, (kind, refs, _) in enumerate(program):
        if kind not in STEP_KINDS:
            return f"step {kind} has no generated form"
        if kind in FLOAT_ONLY and not dtypes[first + k].is_floating_point:
            return f"step {kind} on integers"
        if kind in ("Max", "Min") and len(refs) != 2:
            return f"{kind} of other than two operands"
    return None


def _as(value: str, dtype: torch.dtype, compute: torch.dtype) -> str:
    """`value` (of `dtype`) in the compute type: fp32 for floats."""
    want = torch.float32 if compute.is_floating_point else compute
    return value if dtype == want else f"{value}.to({TL[want]})"


def _expr(kind: str, k: int, ops: list, out: torch.dtype) -> str:
    """Step k's expression over `ops` ((name, dtype) or None per operand), of result dtype `out`."""
    if kind == "Cast":
        name, dtype = ops[0]
        return f"{name} != 0" if out == torch.bool else f"{name}.to({TL[out]})"
    if kind == "Where":
        cond = ops[0][0] if ops[0][1] == torch.bool else f"({ops[0][0]} != 0)"
        return f"tl.where({cond}, {_as(*ops[1], out)}, {_as(*ops[2], out)})"
    if kind == "Clip":
        expr = _as(*ops[0], out)
        if len(ops) > 1 and ops[1] is not None:
            expr = f"tl.maximum({expr}, {_as(*ops[1], out)})"
        if len(ops) > 2 and ops[2] is not None:
            expr = f"tl.minimum({expr}, {_as(*ops[2], out)})"
        return expr
    compute = out if kind not in COMPARE else functools.reduce(torch.promote_types, [d for _, d in ops])
    a, b = ([_as(name, dtype, compute) for name, dtype in ops] + [None])[:2]
    if kind in OPS:
        return f"activate({a}, ACT{k}, a{k}, b{k})"
    return (ARITHMETIC.get(kind) or COMPARE[kind]).format(a=f"({a})", b=f"({b})")


FULL, SCALAR, BROADCAST = "full", "scalar", "broadcast"  # how an input is read


def form(x: torch.Tensor, shape: tuple) -> str:
    """How the kernel reads input `x` for an output of `shape`."""
    return FULL if tuple(x.shape) == tuple(shape) else SCALAR if x.numel() == 1 else BROADCAST


def source(program: list, dtypes: list[torch.dtype], forms: list[str], rank: int, name: str) -> str:
    """The kernel's source: inputs x0.. (FULL, SCALAR: one value, BROADCAST: read through strides xi_s0.. over the
    output's dims D0.. of pitches P0..), each activation step's ACTk name and ak, bk attributes, then y and n.
    `dtypes`: the inputs' then each step's result's."""
    n_in = len(forms)
    acts = [k for k, (kind, _, _) in enumerate(program) if kind in OPS]
    spread = [i for i, f in enumerate(forms) if f == BROADCAST]
    dims = [p for d in range(rank) for p in (f"D{d}", f"P{d}")] if spread else []
    params = [f"x{i}" for i in range(n_in)] + [f"x{i}_s{d}" for i in spread for d in range(rank)] + dims + \
        [p for k in acts for p in (f"a{k}", f"b{k}")] + ["y", "n"] + [f"ACT{k}: tl.constexpr" for k in acts] + \
        ["BLOCK: tl.constexpr", "PDL: tl.constexpr"]
    lines = [f"def {name}({', '.join(params)}):", "    pdl_start(PDL)",
             "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "    inside = offs < n"]
    lines += [f"    i{d} = (offs // P{d}) % D{d}" for d in range(rank)] if spread else []
    for i, f in enumerate(forms):
        at = {FULL: "x{i} + offs", SCALAR: "x{i}",
              BROADCAST: "x{i} + " + " + ".join(f"i{d} * x{{i}}_s{d}" for d in range(rank))}[f].format(i=i)
        lines.append(f"    v{i} = tl.load({at})" if f == SCALAR else f"    v{i} = tl.load({at}, mask=inside, other=0)")
    for k, (kind, refs, _) in enumerate(program):
        ops = [None if r is None else (f"v{r}", dtypes[r]) for r in refs]
        out = dtypes[n_in + k]
        lines.append(f"    v{n_in + k} = ({_expr(kind, k, ops, out)}).to({TL[out]})")
    lines.append(f"    tl.store(y + offs, v{len(dtypes) - 1}.to(y.dtype.element_ty), mask=inside)")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=256)
def _kernel(text: str, name: str):
    """The @triton.jit function of `text`, its source registered in linecache so that Triton can read it back."""
    filename = f"<kiln pointwise chain {name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    scope = {"__name__": __name__, "tl": tl, "pdl_start": common.pdl_start, "activate": common.activate,
             "erf": common.erf}  # __name__: the function's __module__, as for one written here
    exec(compile(text, filename, "exec"), scope)  # noqa: S102 - kiln's own source: no model text goes into it
    return triton.jit(scope[name])


def chain(program: list, dtypes: list[torch.dtype], inputs: list[torch.Tensor], shape: tuple,
          config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The chain's output of `shape` (in `out`'s bytes when given); inputs of `shape` or of one value; `dtypes`:
    the inputs' then each step's result's (the last: the output's)."""
    cfg = config or CONFIGS[0]
    shape = tuple(shape)
    forms = [form(x, shape) for x in inputs]
    text = source(program, dtypes, forms, len(shape), "chain")
    name = "chain_" + hashlib.sha1(text.encode()).hexdigest()[:16]
    fn = _kernel(text.replace("def chain(", f"def {name}(", 1), name)
    y = take(out, shape, dtypes[-1], inputs[0].device)
    n = y.numel()
    if n:
        acts = [(k, resolve(kind, step_attrs(step))) for k, step in enumerate(program) if (kind := step[0]) in OPS]
        xs = [x.contiguous() if f == FULL else x.reshape(1) if f == SCALAR else x for x, f in zip(inputs, forms)]
        strides = [st for x, f in zip(inputs, forms) if f == BROADCAST for st in x.expand(shape).stride()]
        dims = [v for d in range(len(shape)) for v in (shape[d], math.prod(shape[d + 1:]))] \
            if BROADCAST in forms else []
        fn[(triton.cdiv(n, cfg["BLOCK"]),)](*xs, *strides, *dims,
                                            *[v for _, (_, a, b) in acts for v in (float(a), float(b))], y, n,
                                            **{f"ACT{k}": act for k, (act, _, _) in acts}, BLOCK=cfg["BLOCK"],
                                            num_warps=cfg["num_warps"], **pdl_args(y.device))
    return y
