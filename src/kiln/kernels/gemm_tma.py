"""fp16 / bf16 GEMM fed by Hopper's tensor memory accelerator: act(A @ Wᵀ + bias) with A [M, K], W [N, K], fp32
accumulation, the output tile stored by TMA. The persistent form loops each program over tiles so the next tile's
loads run under this tile's epilogue (short reductions: BERT's K = 768 GEMMs, where cuBLASLt reaches ~540 TFLOP/s).

TMA needs row-major operands whose rows and bases sit on 16-byte boundaries (K and N multiples of 8 in fp16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import (ACTIVATIONS, TMA_ALIGN, TensorDescriptor, activate, grouped_tile, pdl_args, pdl_start,
                                 sm_count, tma_dense)
from kiln.kernels.gemm import CONFIG_KEYS
from kiln.kernels.out_buffer import take

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages), best-first: wide tiles two warp groups compute
_SPACE = [(128, 256, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (256, 128, 64, 8, 8, 3), (128, 128, 64, 8, 4, 4),
          (128, 256, 64, 8, 8, 2), (128, 64, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4), (64, 64, 64, 8, 4, 4)]
SMALLEST = dict(zip(CONFIG_KEYS, _SPACE[-1]))


@triton.jit
def _tile(a_desc, w_desc, c_desc, r_desc, bias, N, K, act_alpha, act_beta, off_m, off_n, HAS_BIAS: tl.constexpr,
          HAS_RES: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr):
    """One output tile: the reduction over K, bias, residual (a TMA load) and activation in fp32, the TMA store."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, kb * BLOCK_K])
        b = w_desc.load([off_n, kb * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    if HAS_BIAS:
        rn = off_n + tl.arange(0, BLOCK_N)
        acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        acc += r_desc.load([off_m, off_n]).to(tl.float32)
    acc = activate(acc, ACT, act_alpha, act_beta)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _gemm_kernel(a_desc, w_desc, c_desc, r_desc, bias, M, N, K, act_alpha, act_beta, HAS_BIAS: tl.constexpr,
                 HAS_RES: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    _tile(a_desc, w_desc, c_desc, r_desc, bias, N, K, act_alpha, act_beta, pid_m * BLOCK_M, pid_n * BLOCK_N, HAS_BIAS,
          HAS_RES, ACT, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _gemm_persistent_kernel(a_desc, w_desc, c_desc, r_desc, bias, M, N, K, act_alpha, act_beta,
                            HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                            WARP_SPEC: tl.constexpr, PDL: tl.constexpr):
    """The same tiles, each program taking every num_programs-th one in a flattened loop (or, WARP_SPEC, a loop
    whose loads and math triton gives to separate warps)."""
    pdl_start(PDL)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=not WARP_SPEC,
                         warp_specialize=WARP_SPEC):
        pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M, tile)
        _tile(a_desc, w_desc, c_desc, r_desc, bias, N, K, act_alpha, act_beta, pid_m * BLOCK_M, pid_n * BLOCK_N,
              HAS_BIAS, HAS_RES, ACT, BLOCK_M, BLOCK_N, BLOCK_K)


def smem_bytes(cfg: dict, itemsize: int = 2) -> int:
    """Shared memory of a config: num_stages A and W tiles plus the output tile TMA stores from."""
    return (cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]
            + cfg["BLOCK_M"] * cfg["BLOCK_N"]) * itemsize


def configs(m: int | None, n: int, k: int, smem: int) -> list[dict]:
    """Each tile of the space that fits `smem` and is no larger than the problem (the smallest always), in its
    plain and persistent forms."""
    out = []
    for t in _SPACE:
        cfg = dict(zip(CONFIG_KEYS, t))
        fits = cfg["BLOCK_M"] <= max(64, triton.next_power_of_2(m or 256)) and cfg["BLOCK_N"] <= max(
            64, triton.next_power_of_2(n)) and cfg["BLOCK_K"] <= max(64, triton.next_power_of_2(k))
        if smem_bytes(cfg) <= smem and (fits or cfg == SMALLEST):
            out += [cfg, dict(cfg, persistent=True)]
    return out


def short_k_configs(n: int, k: int, smem: int) -> list[dict]:
    """Tiles for a short reduction that writes many bytes (a 1x1 conv: K = its input channels): BLOCK_K the whole
    reduction up to 64, BLOCK_N the output's width up to 256, best-first (gpu_pointwise_probe, H200, MobileNetV2's 1x1
    convs at b64: 63.5 µs for 16 → 96 channels at 112², where cuBLAS took 185; 128 x 256 tiles need 8 warps)."""
    bn, bk = min(256, max(16, triton.next_power_of_2(n))), min(64, max(16, triton.next_power_of_2(k)))
    tiles = [(128, min(bn, 128), 4, 4, True), (256, bn, 8, 3, True), (128, bn, 8, 3, True), (128, bn, 4, 3, False),
             (256, bn, 8, 3, False), (128, bn, 8, 3, False), (128, max(16, bn // 2), 4, 4, True)]
    out = []
    for bm, tile_n, warps, stages, persistent in tiles:
        cfg = dict(zip(CONFIG_KEYS, (bm, tile_n, bk, 8, warps, stages)), persistent=persistent)
        if smem_bytes(cfg) <= smem and bm * tile_n // (32 * warps) <= 128 and cfg not in out:  # fp32 acc per thread
            out.append(cfg)
    return out


def addressable(*dims: int, itemsize: int = 2) -> bool:
    """Whether rows of these lengths (K, N) meet TMA's 16-byte row strides."""
    return all(d * itemsize % TMA_ALIGN == 0 for d in dims)


def _addressed(t: torch.Tensor | None) -> torch.Tensor | None:
    """t, or a row-major copy in fresh memory where TMA cannot address it (a contiguous view may still start off a
    16-byte boundary, where `contiguous()` would not copy)."""
    return t if tma_dense(t) else t.clone(memory_format=torch.contiguous_format)


def matmul(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, activation: str = "none",
           act_alpha: float = 1.0, act_beta: float = 0.0, config: dict, residual: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """act(a @ wᵀ + bias + residual) in a's dtype: a (M, K), w (N, K) row-major, bias (N,), residual (M, N); written
    into `out`'s bytes when given. Operands TMA cannot address are copied first; an output it cannot is written
    through a fresh tile."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    (m, k), n = a.shape, w.shape[0]
    if not addressable(k, n, itemsize=a.element_size()):
        raise ValueError(f"K ({k}) and N ({n}) must be multiples of {TMA_ALIGN // a.element_size()} for TMA")
    a, w = _addressed(a), _addressed(w)
    c = take(out, (m, n), a.dtype, a.device)
    if m == 0 or n == 0:
        return c
    dst = c if tma_dense(c) else torch.empty_like(c)
    res = _addressed(residual)
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    persistent = config.get("persistent", False)
    kernel, extra = _gemm_kernel, {}
    if persistent:
        kernel, extra = _gemm_persistent_kernel, {"WARP_SPEC": config.get("warp_specialize", False)}
    desc = TensorDescriptor.from_tensor
    kernel[(min(tiles, sm_count(a.device)) if persistent else tiles,)](
        desc(a, [bm, bk]), desc(w, [bn, bk]), desc(dst, [bm, bn]), desc(dst if res is None else res, [bm, bn]),
        bias if bias is not None else dst, m, n, k, float(act_alpha), float(act_beta), HAS_BIAS=bias is not None,
        HAS_RES=res is not None, ACT=activation, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config["GROUP_M"],
        num_warps=config["num_warps"], num_stages=config["num_stages"], **extra, **pdl_args(a.device))
    if dst is not c:
        c.copy_(dst)
    return c
