"""Two chained int8 GEMMs in one persistent Gluon kernel for Hopper (kinds/quantized.QuantConvChain: a bottleneck's
last 1x1 conv, whose output the next block's first 1x1 conv reads). Per tile of BLOCK_M rows, chunk by chunk of
BLOCK_N output channels: acc = a @ w[chunk]ᵀ, y = int8(act(acc·scale + bias + r·res_scale)) into shared memory,
stored by TMA and fed straight to the second wgmma, acc2 += y @ w2[:, chunk]ᵀ; then z = int8(act2(acc2·scale2 +
bias2)). Without a shortcut, chunk j + 1's first GEMM runs under chunk j's epilogue. The weights stay in shared
memory; rows come through a ring of STAGES tiles, residual chunks through a ring of RSTAGES. In place of the
residual y may add a shortcut conv of other rows (a QuantConvPair's: ResNet's layer-1 projection block). The block
output (ResNet-50 layer 1: 51 MB at batch 64) is written once and never read back.
"""
from __future__ import annotations

import torch
import triton

from kiln.kernels import int8_gemm_wgmma as wg
from kiln.kernels.common import pdl_args
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "STAGES", "RSTAGES", "num_warps", "stream")  # stream: programs per SM
# (BLOCK_M, BLOCK_N, num_warps): the chunk's accumulator and the second GEMM's [BLOCK_M, N2] live at once; 64-row
# tiles first (ResNet-50 layer 1 on an H100: 54-57 µs against 61-66 for 128 rows, 71-75 for 128 rows on four warps)
_SPACE = [(64, 128, 4), (64, 64, 4), (128, 64, 8), (128, 128, 8)]
MAX_N2 = 256  # the second GEMM's output channels: one wgmma's N, one TMA box row
BARRIER_BYTES = 128


def available() -> bool:
    return wg.available()


if wg.gluon is not None:
    gluon, gl = wg.gluon, wg.gl
    mbarrier, tma = wg.mbarrier, wg.tma

    @gluon.jit
    def _rows_issue(a_desc, a_s, x_desc, x_s, bars, u, first, step, STAGES: gl.constexpr, HAS_X: gl.constexpr,
                    pred):
        """The program's tile u's rows (one box: K is at most 128), and the shortcut conv's, into their ring slot."""
        BM: gl.constexpr = a_desc.block_type.shape[0]
        bar = bars.index(u % STAGES)
        mbarrier.expect(bar, BM * (a_desc.block_type.shape[1] + (x_desc.block_type.shape[1] if HAS_X else 0)),
                        pred=pred)
        wg.tma_load(a_desc, [(first + u * step) * BM, 0], bar, a_s.index(u % STAGES), pred=pred)
        if HAS_X:
            wg.tma_load(x_desc, [(first + u * step) * BM, 0], bar, x_s.index(u % STAGES), pred=pred)

    @gluon.jit
    def _res_issue(r_desc, r_s, bars, u, first, step, NC: gl.constexpr, STAGES: gl.constexpr,
                   RSTAGES: gl.constexpr, pred):
        """Residual unit u (the program's tile u // NC, chunk u % NC) into its ring slot (barriers after the rows')."""
        BM: gl.constexpr = r_desc.block_type.shape[0]
        BN: gl.constexpr = r_desc.block_type.shape[1]
        bar = bars.index(STAGES + u % RSTAGES)
        mbarrier.expect(bar, BM * BN, pred=pred)
        wg.tma_load(r_desc, [(first + (u // NC) * step) * BM, (u % NC) * BN], bar, r_s.index(u % RSTAGES),
                     pred=pred)

    @gluon.jit
    def _store(q, buf, desc, coord, PENDING: gl.constexpr):
        """q into `buf` once the TMA store that last used it has left (at most PENDING younger ones in flight),
        then stored by TMA at `coord`."""
        tma.store_wait(PENDING)
        wg.sync_warps()
        buf.store(q)
        wg.fence_async_shared()
        wg.sync_warps()  # the whole chunk is in shared memory before one thread stores it or wgmma reads it
        wg.tma_store(desc, coord, buf)

    @gluon.jit
    def _first_gemm(a, w, zero):
        """One chunk of the first GEMM (one K block) from the accumulator `zero`, issued asynchronously."""
        return wg.warpgroup_mma(a, w.permute((1, 0)), zero, is_async=True)

    @gluon.jit
    def _chain_kernel(a_desc, w_desc, r_desc, w2_desc, y_desc, z_desc, x_desc, wx_desc, scale, bias, scale2, bias2,
                      scale_x, bias_x, M, out_inv, res_scale, out2_inv, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr,
                      ACT: gl.constexpr, HAS_BIAS2: gl.constexpr, ACT2: gl.constexpr, HAS_X: gl.constexpr,
                      HAS_BIAS_X: gl.constexpr, NC: gl.constexpr, STAGES: gl.constexpr, RSTAGES: gl.constexpr,
                      PDL: gl.constexpr):
        BM: gl.constexpr = a_desc.block_type.shape[0]
        K: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = w_desc.block_type.shape[0]
        N2: gl.constexpr = w2_desc.block_type.shape[0]
        KX: gl.constexpr = x_desc.block_type.shape[1]
        first = gl.program_id(0)
        step = gl.num_programs(0)
        count = gl.cdiv(gl.cdiv(M, BM) - first, step)

        w_s = gl.allocate_shared_memory(w_desc.dtype, [NC, BN, K], w_desc.layout)
        w2_s = gl.allocate_shared_memory(w2_desc.dtype, [NC, N2, BN], w2_desc.layout)
        a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, K], a_desc.layout)
        r_s = gl.allocate_shared_memory(r_desc.dtype, [RSTAGES if HAS_RES else 1, BM, BN], r_desc.layout)
        y_s = gl.allocate_shared_memory(y_desc.dtype, [NC, BM, BN], y_desc.layout)
        z_s = gl.allocate_shared_memory(z_desc.dtype, [BM, N2], z_desc.layout)
        wx_s = gl.allocate_shared_memory(wx_desc.dtype, [NC if HAS_X else 1, BN, KX], wx_desc.layout)
        x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES if HAS_X else 1, BM, KX], x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES + RSTAGES + 1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES + RSTAGES + 1):  # rows, residual chunks, weights
            mbarrier.init(bars.index(i), count=1)
        wbar = bars.index(STAGES + RSTAGES)
        mbarrier.expect(wbar, NC * (BN * K + N2 * BN + (BN * KX if HAS_X else 0)))
        for j in gl.static_range(NC):
            wg.tma_load(w_desc, [j * BN, 0], wbar, w_s.index(j))
            wg.tma_load(w2_desc, [0, j * BN], wbar, w2_s.index(j))
            if HAS_X:
                wg.tma_load(wx_desc, [j * BN, 0], wbar, wx_s.index(j))
        wg.gdc_start(PDL)  # the weights load while the previous kernel drains
        for u in gl.static_range(STAGES - 1):
            _rows_issue(a_desc, a_s, x_desc, x_s, bars, u, first, step, STAGES, HAS_X, u < count)
        if HAS_RES:
            for u in gl.static_range(RSTAGES - 1):
                _res_issue(r_desc, r_s, bars, u, first, step, NC, STAGES, RSTAGES, u < count * NC)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BN, 32])
        mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                       instr_shape=[16, N2, 32])
        zero = gl.zeros((BM, BN), gl.int32, layout=mma)
        rn2 = gl.arange(0, N2, layout=gl.SliceLayout(0, mma2))
        col_scale2 = gl.expand_dims(gl.load(scale2 + rn2), 0)
        col_bias2 = gl.expand_dims(gl.load(bias2 + rn2), 0)
        mbarrier.wait(wbar, 0)
        for i in range(count):
            s = i % STAGES
            wg.sync_warps()  # every warp is past tile i - 1, whose slot takes tile i + STAGES - 1
            _rows_issue(a_desc, a_s, x_desc, x_s, bars, i + STAGES - 1, first, step, STAGES, HAS_X,
                        i + STAGES - 1 < count)
            mbarrier.wait(bars.index(s), (i // STAGES) & 1)
            off_m = (first + i * step) * BM
            acc2 = gl.zeros((BM, N2), gl.int32, layout=mma2)
            if not HAS_X:  # chunk j + 1's first GEMM runs under chunk j's epilogue (with a shortcut's too, the
                # accumulators spill: 84 against 57 us at BLOCK_N 128)
                nxt = _first_gemm(a_s.index(s), w_s.index(0), zero)
            for j in gl.static_range(NC):
                c = i * NC + j
                if HAS_RES:  # into the slot of chunk c - 1, whose residual every warp has read (the store's barrier)
                    _res_issue(r_desc, r_s, bars, c + RSTAGES - 1, first, step, NC, STAGES, RSTAGES,
                               c + RSTAGES - 1 < count * NC)
                rn = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
                if HAS_X:  # the shortcut conv's value, as QuantConvPair sums them
                    acc = _first_gemm(a_s.index(s), w_s.index(j), zero)
                    acc_x = _first_gemm(x_s.index(s), wx_s.index(j), zero)
                    acc, acc_x, acc2 = wg.warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_x, acc2))
                    v_x = acc_x.to(gl.float32) * gl.expand_dims(gl.load(scale_x + rn), 0)
                    if HAS_BIAS_X:
                        v_x += gl.expand_dims(gl.load(bias_x + rn), 0)
                else:
                    acc = nxt
                    if j + 1 < NC:
                        nxt = _first_gemm(a_s.index(s), w_s.index(j + 1), zero)
                    acc, acc2 = wg.warpgroup_mma_wait(num_outstanding=1 if j + 1 < NC else 0, deps=(acc, acc2))
                v = acc.to(gl.float32) * gl.expand_dims(gl.load(scale + rn), 0)
                if HAS_BIAS:
                    v += gl.expand_dims(gl.load(bias + rn), 0)
                if HAS_X:
                    v = v + v_x
                if HAS_RES:
                    mbarrier.wait(bars.index(STAGES + c % RSTAGES), (c // RSTAGES) & 1)
                    v += r_s.index(c % RSTAGES).load(mma).to(gl.float32) * res_scale
                _store(wg.activate_requant(v, out_inv, ACT), y_s.index(j), y_desc, [off_m, j * BN], NC)
                acc2 = wg.warpgroup_mma(y_s.index(j), w2_s.index(j).permute((1, 0)), acc2, is_async=True)
            acc2 = wg.warpgroup_mma_wait(num_outstanding=0, deps=(acc2,))
            v2 = acc2.to(gl.float32) * col_scale2
            if HAS_BIAS2:
                v2 += col_bias2
            _store(wg.activate_requant(v2, out2_inv, ACT2), z_s, z_desc, [off_m, 0], NC)
        tma.store_wait(0)
        for i in gl.static_range(STAGES + RSTAGES + 1):
            mbarrier.invalidate(bars.index(i))


def smem_bytes(cfg: dict, k: int, n: int, n2: int, residual: bool, kx: int = 0) -> int:
    """One program's shared memory: the weights, STAGES row tiles (and the shortcut's, of kx columns), RSTAGES
    residual chunks, the y and z tiles."""
    bm, bn, stages = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["STAGES"]  # (unused buffers are not allocated)
    return n * k + n2 * n + n * kx + stages * bm * (k + kx) + residual * cfg["RSTAGES"] * bm * bn + bm * n + \
        bm * n2 + BARRIER_BYTES


def configs(m: int | None, k: int, n: int, n2: int, smem: int, residual: bool, kx: int = 0) -> list[dict]:
    """Tiles whose weights, rings and output tiles fit `smem` two programs to a multiprocessor (one's latencies hidden
    behind the other's work), then three, then one; the residual ring as deep as fits up to eight chunks; none unless
    K is 32..128 (one TMA box row) in whole 32-wide wgmma steps (kx too, when there is a shortcut conv), N a
    multiple of 64 and N2 of 16 within one wgmma."""
    if any(d % 32 or d > 128 for d in (k, kx or 32)) or n % 64 or n2 % 16 or n2 > MAX_N2:
        return []
    out = []
    for per_sm in (2, 3, 1):
        for stages in (2, 3):
            for bm, bn, warps in _SPACE:
                if n % bn or (m is not None and bm > max(64, triton.next_power_of_2(m))):
                    continue
                for rstages in (8, 6, 4, 3, 2):
                    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "STAGES": stages, "RSTAGES": rstages, "num_warps": warps,
                           "stream": per_sm}
                    if per_sm * (smem_bytes(cfg, k, n, n2, residual, kx) + 1024) <= smem:
                        out.append(cfg)
                        break
    return out


def chain(a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
          residual: torch.Tensor | None, w2: torch.Tensor, scale2: torch.Tensor, bias2: torch.Tensor | None, *,
          out_scale: float, res_scale: float | None = None, activation: str = "none", out2_scale: float,
          activation2: str = "none", config: dict, out: torch.Tensor | None = None,
          out2: torch.Tensor | None = None, shortcut: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, z): y = int8 at out_scale of act(a [M, K] @ w [N, K]ᵀ·scale + bias + residual [M, N]·res_scale),
    z = int8 at out2_scale of act2(y @ w2 [N2, N]ᵀ·scale2 + bias2), all int8 rows dense (16-byte multiples).
    `shortcut` (x [M, KX], wx [N, KX], scale_x, bias_x or None) adds a second conv's fp32 value to y's in place of
    the residual, as QuantConvPair does. ValueError for what it does not take (the tactic checks first)."""
    if not available():
        raise ValueError("this triton has no Gluon")
    if activation not in wg.ACTIVATIONS or activation2 not in wg.ACTIVATIONS or \
            {t.dtype for t in (a, w, w2)} != {torch.int8}:
        raise ValueError(f"int8 operands and one of the activations {wg.ACTIVATIONS} only")
    (m, k), n, n2 = a.shape, w.shape[0], w2.shape[0]
    if w.shape[1] != k or w2.shape[1] != n:
        raise ValueError(f"shapes do not chain: a {tuple(a.shape)}, w {tuple(w.shape)}, w2 {tuple(w2.shape)}")
    if residual is not None and (residual.dtype != torch.int8 or res_scale is None or residual.shape != (m, n)
                                 or residual.stride(1) != 1 or residual.stride(0) % 16):
        raise ValueError("the residual must be int8 [M, N], dense 16-byte rows, with a res_scale")
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    x, wx, scale_x, bias_x = shortcut or (a, w, scale, None)
    if shortcut is not None and (residual is not None or x.shape[0] != m or wx.shape != (n, x.shape[1]) or
                                 {x.dtype, wx.dtype} != {torch.int8}):
        raise ValueError("a shortcut conv takes int8 x [M, KX] and wx [N, KX], and no residual")
    kx = x.shape[1] if shortcut is not None else 0
    if not configs(None, k, n, n2, 1 << 30, residual is not None, kx) or n % bn:
        raise ValueError("K must be 32..128 in steps of 32, N a multiple of BLOCK_N and 64, N2 16..256")
    y = take(out, (m, n), torch.int8, a.device)
    z = take(out2, (m, n2), torch.int8, a.device)
    if m == 0:
        return y, z
    r = residual if residual is not None else y
    tiles = triton.cdiv(m, bm)
    _chain_kernel[(min(tiles, config.get("stream", 1) * wg.multiprocessors(a.device)),)](
        wg.desc(a, [bm, k]), wg.desc(w, [bn, k]), wg.desc(r, [bm, bn]), wg.desc(w2, [n2, bn]),
        wg.desc(y, [bm, bn]), wg.desc(z, [bm, n2]), wg.desc(x, [bm, x.shape[1]]), wg.desc(wx, [bn, x.shape[1]]),
        scale, bias if bias is not None else scale, scale2, bias2 if bias2 is not None else scale2, scale_x,
        bias_x if bias_x is not None else scale_x, m, inv_scale(out_scale), float(res_scale or 1.0),
        inv_scale(out2_scale), HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation,
        HAS_BIAS2=bias2 is not None, ACT2=activation2, HAS_X=shortcut is not None, HAS_BIAS_X=bias_x is not None,
        NC=n // bn, STAGES=config["STAGES"], RSTAGES=config["RSTAGES"], num_warps=config["num_warps"],
        enable_fp_fusion=False, **pdl_args(a.device))
    return y, z
