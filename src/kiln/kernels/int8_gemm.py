"""int8 or fp8 (e4m3) GEMM with kiln's quantized epilogue fused (kinds/quantized.py has the exact arithmetic):

    acc = A_q @ W_q (int8: int32, exact; fp8: fp32, tl.dot on fp8 operands)
    y = fp32(acc) · (x_scale · w_scale[n]) + bias[n] + residual[m, n];  y = act(y)
        (a residual of the operands' type, `res_scale` given, is added as fp32(r_q) · res_scale)
    out = y (fp32 or fp16), or requantized: int8(clamp(round_half_even(y · inv), -127, 127)), or for fp8 the
    nearest e4m3 value of y · inv (ties to even), saturated to ±448; inv = kinds.quantized.inv_scale(out_scale)

A is (M, K), W is (K, N), both int8 or both float8_e4m3fn (any strides: a [N, K] weight is passed as its
transpose view). Rounding half to even uses the fp32 add/subtract of 1.5·2²³ (exact for |v| ≤ 2²²); fp8 rounds
in fp32 arithmetic at the value's e4m3 step, so the store converts an exact value (round_e4m3). Kernels compile
without fp contraction (enable_fp_fusion=False): each product and sum rounds as the reference's does. \
fp8 products are promoted into the fp32 accumulator every 32 (Hopper's fp8 MMA alone
keeps fewer bits), as cuBLAS does without fast accumulation. Configs are the fp GEMM's tiles at 1-byte itemsize,
BLOCK_K ≥ 32 (int8 and fp8 MMA depth).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels import gemm
from kiln.kernels.common import ACTIVATIONS, DEFAULT_SMEM, activate, grouped_tile
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 · 2²³: v + M - M rounds v to the nearest integer, ties to even (|v| < 2²²)
MAGIC_BITS = tl.constexpr(0x4B400000)  # ROUND_MAGIC's fp32 bits: bits(v + M) - MAGIC_BITS is that integer
MIN_BLOCK_K = 32
FP8_PROMOTE = tl.constexpr(32)  # fp8 products summed in the MMA unit before they join the fp32 accumulator
QUANTIZED_OPERANDS = (torch.int8, torch.float8_e4m3fn)


@triton.jit
def round_e4m3(v):
    """fp32 → the nearest float8 e4m3fn value (ties to even) saturated to ±448, still fp32: rounded here at the
    value's e4m3 step (2^(e-3), 2⁻⁹ for subnormals), so converting it to fp8 is exact on any backend."""
    v = tl.minimum(tl.maximum(v, -448.0), 448.0)
    binade = v.to(tl.int32, bitcast=True) & 0x7F800000  # 2^e of |v|, as fp32 bits
    step = tl.maximum(binade - (3 << 23), 0x3B000000)  # 2^(e-3) (3 mantissa bits), at least 2⁻⁹
    inv = ((254 << 23) - step).to(tl.float32, bitcast=True)  # 1 / step, exact
    return ((v * inv + ROUND_MAGIC) - ROUND_MAGIC) * step.to(tl.float32, bitcast=True)


@triton.jit
def load_operand(ptrs, mask, FP8: tl.constexpr):
    """A masked tile of int8 or fp8 operands, zeros outside the mask (fp8 takes a float zero, int8 an integer)."""
    if FP8:
        v = tl.load(ptrs, mask=mask, other=0.0)
    else:
        v = tl.load(ptrs, mask=mask, other=0)
    return v


@triton.jit
def requant(v, out_inv, FP8: tl.constexpr, LOW: tl.constexpr = -127.0):
    """An fp32 epilogue value → its quantized value: for int8 the int32 integer (the store truncates it), clamped
    to [LOW, 127], for fp8 e4m3 the fp32 value exact in e4m3; out_inv = inv_scale(out_scale)."""
    q = v * out_inv
    if FP8:
        q = round_e4m3(q)
    else:
        q = tl.minimum(tl.maximum(q, LOW), 127.0)
        q = (q + ROUND_MAGIC).to(tl.int32, bitcast=True) - MAGIC_BITS  # the rounded integer, read from the bits
    return q


@triton.jit
def int_to_f32(q):
    """An integer tile with |q| < 2²² (int8 activations) → fp32, exactly: the bits of 1.5·2²³ + q less 1.5·2²³,
    an integer and an fp32 add where a conversion would take the GPU's quarter-rate unit."""
    return (q.to(tl.int32) + MAGIC_BITS).to(tl.float32, bitcast=True) - ROUND_MAGIC


@triton.jit
def dequant(r, res_scale, FP8: tl.constexpr):
    """A quantized residual tile → the fp32 value the epilogue adds: fp32(r) · res_scale (one product)."""
    if FP8:
        v = r.to(tl.float32)
    else:
        v = int_to_f32(r)
    return v * res_scale


@triton.jit
def epilogue(acc, scale, bias, rn, n_ok, r, act_alpha, act_beta, out_inv, HAS_BIAS: tl.constexpr,
             HAS_RES: tl.constexpr, ACT: tl.constexpr, REQUANT: tl.constexpr, FP8: tl.constexpr):
    """The quantized epilogue every int8 / fp8 kernel shares: fp32(acc)·scale[n] + bias[n] + r (the residual
    tile as fp32, when HAS_RES), the activation, then requantization (REQUANT) — the values to store."""
    v = acc.to(tl.float32) * tl.load(scale + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        v += tl.load(bias + rn, mask=n_ok, other=0.0)[None, :]
    if HAS_RES:
        v += r
    if REQUANT and not FP8 and ACT == "relu":  # relu as the clamp's lower bound: exact, as out_inv > 0
        v = requant(v, out_inv, FP8, 0.0)
    else:
        v = activate(v, ACT, act_alpha, act_beta)
        if REQUANT:
            v = requant(v, out_inv, FP8)
    return v


@triton.jit
def residual_tile(ptrs, mask, res_scale, RES_Q: tl.constexpr, FP8: tl.constexpr):
    """A residual tile as the fp32 value the epilogue adds: a float one as is, a quantized one (RES_Q, of the
    operands' type) times res_scale (one fp32 product)."""
    if RES_Q:
        return dequant(load_operand(ptrs, mask, FP8), res_scale, FP8)
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _int8_gemm_kernel(a, w, scale, bias, res, c, M, N, K, out_inv, res_scale, act_alpha, act_beta,
                      s_am, s_ak, s_wk, s_wn, s_rm, s_rn, s_cm, s_cn,
                      HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, RES_Q: tl.constexpr, REQUANT: tl.constexpr,
                      ACT: tl.constexpr, FP8: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a + (rm % M)[:, None] * s_am + rk[None, :] * s_ak
    w_ptrs = w + rk[:, None] * s_wk + (rn % N)[None, :] * s_wn
    if FP8:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kb * BLOCK_K
        x = load_operand(a_ptrs, rk[None, :] < k_left, FP8)
        y = load_operand(w_ptrs, rk[:, None] < k_left, FP8)
        if FP8:
            acc = tl.dot(x, y, acc, out_dtype=tl.float32, max_num_imprecise_acc=FP8_PROMOTE)
        else:
            acc = tl.dot(x, y, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K * s_ak
        w_ptrs += BLOCK_K * s_wk

    inside = (rm < M)[:, None] & (rn < N)[None, :]
    r = 0.0
    if HAS_RES:
        r = residual_tile(res + rm[:, None] * s_rm + rn[None, :] * s_rn, inside, res_scale, RES_Q, FP8)
    v = epilogue(acc, scale, bias, rn, rn < N, r, act_alpha, act_beta, out_inv, HAS_BIAS, HAS_RES, ACT, REQUANT, FP8)
    tl.store(c + rm[:, None] * s_cm + rn[None, :] * s_cn, v.to(c.dtype.element_ty), mask=inside)


def check_residual(residual: torch.Tensor | None, res_scale: float | None, qdtype: torch.dtype) -> None:
    """A residual is of the operands' type exactly when `res_scale` is given (else a float type)."""
    if residual is not None and (res_scale is not None) != (residual.dtype == qdtype):
        raise ValueError(f"a {residual.dtype} residual with res_scale {res_scale} and {qdtype} operands: a "
                         f"{qdtype} residual needs res_scale, a float one none")


def configs(m: int | None, n: int, k: int, smem: int, level: int) -> list[dict]:
    """The fp GEMM's tile configs at 1-byte itemsize, with BLOCK_K raised to the int8 / fp8 MMA depth."""
    out = []
    for cfg in gemm.configs(m, n, k, 1, smem, level):
        cfg = dict(cfg, BLOCK_K=max(cfg["BLOCK_K"], MIN_BLOCK_K))
        if gemm.smem_bytes(cfg, 1) <= smem and cfg not in out:
            out.append(cfg)
    return out


def matmul(a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, *, out_scale: float | None = None, res_scale: float | None = None,
           activation: str = "none", act_alpha: float = 1.0, act_beta: float = 0.0,
           out_dtype: torch.dtype = torch.float32, config: dict | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """The module docstring's epilogue over a (M, K) @ w (K, N), both int8 or both fp8 e4m3; `scale` is fp32 [N]
    (x_scale · w_scale, one fp32 product), bias fp32 [N], residual (M, N) any float type, or a's type with
    `res_scale`; out in a's type when `out_scale` is given, else `out_dtype` (the fp32 value rounded once on store)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    if a.dtype not in QUANTIZED_OPERANDS or w.dtype != a.dtype:
        raise ValueError(f"operands must be both int8 or both float8_e4m3fn, got {a.dtype} and {w.dtype}")
    check_residual(residual, res_scale, a.dtype)
    (m, k), n = a.shape, w.shape[1]
    cfg = config or configs(m, n, k, DEFAULT_SMEM, 1)[0]
    c = take(out, (m, n), a.dtype if out_scale is not None else out_dtype, a.device)  # in `out`'s bytes if given
    if m == 0 or n == 0:
        return c
    r = residual if residual is not None else c
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _int8_gemm_kernel[grid](a, w, scale, bias if bias is not None else scale, r, c, m, n, k,
                            inv_scale(out_scale) if out_scale is not None else 1.0, float(res_scale or 1.0),
                            float(act_alpha), float(act_beta),
                            a.stride(0), a.stride(1), w.stride(0), w.stride(1), r.stride(0), r.stride(1),
                            c.stride(0), c.stride(1), HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                            RES_Q=res_scale is not None, REQUANT=out_scale is not None, ACT=activation,
                            FP8=a.dtype == torch.float8_e4m3fn,
                            enable_fp_fusion=False, **{key: cfg[key] for key in gemm.CONFIG_KEYS})
    return c
