"""int8 or fp8 (e4m3) GEMM fed by Hopper's tensor memory accelerator (TMA): A [M, K] and W [N, K] tiles arrive
by bulk asynchronous copies (out-of-range rows and columns read as zeros), the quantized epilogue of
kernels/int8_gemm.py runs on the accumulator, and the output tile leaves by a TMA store (clipped at the edges).

TMA needs compute capability 9.0 (the tactic checks), row-major operands and rows and bases on 16-byte
boundaries; a call whose tensors are not so runs kernels/int8_gemm.py with the same tile. Same arithmetic.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from kiln.kernels.common import ACTIVATIONS, TMA_ALIGN, TensorDescriptor, grouped_tile, sm_count, tma_dense
from kiln.kernels.gemm import CONFIG_KEYS
from kiln.kernels import int8_gemm
from kiln.kernels.int8_gemm import FP8_PROMOTE, QUANTIZED_OPERANDS, dequant, epilogue
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages), best-first: the winners at ResNet-50 b64 1x1-conv and
# BERT b64 GEMM shapes on an H100 (results/int8-kernel-probe-fast-div-…json), then wider and smaller tiles; then
# two-stage tiles for short reductions (K of one or two blocks: ResNet's 64- and 128-channel 1x1 convs), whose
# smaller shared memory lets several tiles share an SM and overlap one's loads with another's epilogue
_SMALLEST = (64, 64, 64, 8, 4, 4)
_SPACE = [(128, 128, 64, 8, 4, 5), (64, 128, 128, 8, 4, 4), (128, 64, 64, 8, 4, 5), (128, 128, 128, 8, 8, 4),
          (256, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 4), (64, 64, 128, 8, 4, 4), _SMALLEST,
          (128, 128, 64, 8, 4, 2), (128, 256, 64, 8, 8, 2), (256, 128, 64, 8, 8, 2), (128, 64, 64, 8, 4, 2)]
SHORT_K = 128  # reductions this short also try the two-stage tiles
# persistent tiles (programs loop over tiles, next loads under this epilogue), tried first where the layer is
# memory-bound: K ≤ PERSISTENT_K (ResNet's 64-256-channel 1x1 convs, whose M·N output dwarfs the reduction)
_PERSISTENT = [(128, 128, 64, 8, 4, 3), (128, 64, 64, 8, 4, 4)]
PERSISTENT_K = 256
PROGRAMS_PER_SM = 2


@triton.jit
def _tile(a_desc, w_desc, c_desc, r_desc, res, s_rm, scale, bias, M, N, K, out_inv, res_scale, act_alpha, act_beta,
          off_m, off_n, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, RES_Q: tl.constexpr,
          RES_EARLY: tl.constexpr, REQUANT: tl.constexpr, ACT: tl.constexpr, FP8: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One output tile: the reduction over K, the quantized epilogue, the TMA store."""
    rn = off_n + tl.arange(0, BLOCK_N)
    if HAS_RES and RES_EARLY:  # the residual's loads issued before the reduction, so they land while it runs
        rm = off_m + tl.arange(0, BLOCK_M)
        r_early = tl.load(res + rm[:, None] * s_rm + rn[None, :], mask=(rm < M)[:, None] & (rn < N)[None, :],
                          other=0)
    if FP8:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([off_m, kb * BLOCK_K])
        b = w_desc.load([off_n, kb * BLOCK_K])
        if FP8:
            acc = tl.dot(a, b.T, acc, out_dtype=tl.float32, max_num_imprecise_acc=FP8_PROMOTE)
        else:
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
    r = 0.0
    if HAS_RES:
        if RES_EARLY:
            r = r_early
        else:
            r = r_desc.load([off_m, off_n])
        r = dequant(r, res_scale, FP8) if RES_Q else r.to(tl.float32)
    v = epilogue(acc, scale, bias, rn, rn < N, r, act_alpha, act_beta, out_inv, HAS_BIAS, HAS_RES, ACT, REQUANT, FP8)
    c_desc.store([off_m, off_n], v.to(c_desc.dtype))


@triton.jit
def _tma_gemm_kernel(a_desc, w_desc, c_desc, r_desc, res, s_rm, scale, bias, M, N, K, out_inv, res_scale, act_alpha,
                     act_beta, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, RES_Q: tl.constexpr,
                     RES_EARLY: tl.constexpr, REQUANT: tl.constexpr, ACT: tl.constexpr, FP8: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    _tile(a_desc, w_desc, c_desc, r_desc, res, s_rm, scale, bias, M, N, K, out_inv, res_scale, act_alpha, act_beta,
          pid_m * BLOCK_M, pid_n * BLOCK_N, HAS_BIAS, HAS_RES, RES_Q, RES_EARLY, REQUANT, ACT, FP8, BLOCK_M, BLOCK_N,
          BLOCK_K)


@triton.jit
def _tma_gemm_persistent_kernel(a_desc, w_desc, c_desc, r_desc, res, s_rm, scale, bias, M, N, K, out_inv, res_scale,
                                act_alpha, act_beta, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                                RES_Q: tl.constexpr, RES_EARLY: tl.constexpr, REQUANT: tl.constexpr,
                                ACT: tl.constexpr, FP8: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """The same tiles, each program looping over every num_programs-th one: the flattened loop lets the next
    tile's loads run under this tile's epilogue and store (memory-bound layers: short K, big M·N)."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=True):
        pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M, tile)
        _tile(a_desc, w_desc, c_desc, r_desc, res, s_rm, scale, bias, M, N, K, out_inv, res_scale, act_alpha,
              act_beta, pid_m * BLOCK_M, pid_n * BLOCK_N, HAS_BIAS, HAS_RES, RES_Q, RES_EARLY, REQUANT, ACT, FP8,
              BLOCK_M, BLOCK_N, BLOCK_K)



def configs(m: int | None, n: int, k: int, smem: int) -> list[dict]:
    """Tiles that fit `smem` (num_stages A and W tiles plus the output tile) and do not dwarf the problem, the
    smallest tile always; for K ≤ SHORT_K the two-stage tiles lead, for K ≤ PERSISTENT_K the persistent ones
    before them."""
    out = []
    for t in _SPACE:
        cfg = dict(zip(CONFIG_KEYS, t))
        need = cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] + 4 * cfg["BLOCK_M"] * cfg[
            "BLOCK_N"]
        fits = cfg["BLOCK_K"] <= max(64, triton.next_power_of_2(k)) and cfg["BLOCK_N"] <= max(
            64, triton.next_power_of_2(n)) and cfg["BLOCK_M"] <= max(64, triton.next_power_of_2(m or 256))
        if need <= smem and (fits or t == _SMALLEST) and (cfg["num_stages"] > 2 or k <= SHORT_K):
            out.append(cfg)
    if k <= SHORT_K:  # short reductions: the two-stage tiles first, so the default opt level times them (a
        out.sort(key=lambda c: c["num_stages"] > 2)  # 39 µs against 74 µs at ResNet-50's 64→256 1x1 conv)
    if k <= PERSISTENT_K:
        out = [dict(zip(CONFIG_KEYS, t), persistent=True) for t in _PERSISTENT] + out
    return out


def matmul(a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, *, out_scale: float | None = None, res_scale: float | None = None,
           activation: str = "none", act_alpha: float = 1.0, act_beta: float = 0.0,
           out_dtype: torch.dtype = torch.float32, config: dict, out: torch.Tensor | None = None,
           res_early: bool = True) -> torch.Tensor:
    """kernels/int8_gemm.matmul's result for a (M, K) @ w (N, K)ᵀ (`w` N-major here), through TMA; `res_scale`
    dequantizes a residual of a's type. `res_early` loads the residual by pointers before the reduction (2-5 %
    faster at ResNet-50's residual convs on an H100) instead of by TMA after it."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    if a.dtype not in QUANTIZED_OPERANDS or w.dtype != a.dtype:
        raise ValueError(f"operands must be both int8 or both float8_e4m3fn, got {a.dtype} and {w.dtype}")
    (m, k), n = a.shape, w.shape[0]
    dtype = a.dtype if out_scale is not None else out_dtype
    if not (tma_dense(a) and tma_dense(w) and tma_dense(residual)) or (n * dtype.itemsize) % TMA_ALIGN or (
            out is not None and out.data_ptr() % TMA_ALIGN):
        return int8_gemm.matmul(a, w.t(), scale, bias, residual, out_scale=out_scale, res_scale=res_scale,
                                activation=activation, act_alpha=act_alpha, act_beta=act_beta, out_dtype=out_dtype,
                                config=config, out=out)
    c = take(out, (m, n), dtype, a.device)
    if m == 0 or n == 0:
        return c
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    r = residual if residual is not None else c
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    persistent = config.get("persistent", False)
    kernel = _tma_gemm_persistent_kernel if persistent else _tma_gemm_kernel
    grid = (min(tiles, PROGRAMS_PER_SM * sm_count(a.device)) if persistent else tiles,)
    kernel[grid](TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                 TensorDescriptor.from_tensor(c, [bm, bn]), TensorDescriptor.from_tensor(r, [bm, bn]), r, r.stride(0),
                 scale, bias if bias is not None else scale, m, n, k,
                 inv_scale(out_scale) if out_scale is not None else 1.0, float(res_scale or 1.0), float(act_alpha),
                 float(act_beta), HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                 RES_Q=res_scale is not None, RES_EARLY=res_early or persistent, REQUANT=out_scale is not None,
                 ACT=activation, FP8=a.dtype == torch.float8_e4m3fn, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                 GROUP_M=config["GROUP_M"], num_warps=config["num_warps"], num_stages=config["num_stages"],
                 enable_fp_fusion=False)
    return c
