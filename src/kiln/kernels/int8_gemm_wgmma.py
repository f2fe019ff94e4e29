"""int8 GEMM for Hopper written in Gluon, so that one wgmma stays in flight while the next is issued: Triton's
pipeliner keeps a wgmma asynchronous only when its accumulator is fp32, so every int8 `tl.dot` waits for its
own completion. Here the loop issues wgmma k, waits until at most one is pending (wgmma k-1 done), and refills
k-1's shared-memory slot by TMA: 1278 against 1071 TOP/s at 4096³ on an H100. For short reductions (ResNet's 1x1
convs, bound by memory and per-tile latency) a persistent streaming kernel overlaps one tile's loads with the
previous tile's epilogue instead.

Same arithmetic as kernels/int8_gemm.epilogue for the cases it takes: fp32(acc)·scale[n] + bias[n] (+ an int8
residual times res_scale), ReLU, erf GELU or none, requantized to int8 (v·out_inv clamped to ±127, rounded half to even
by the 1.5·2²³ add). Needs triton's Gluon (3.6+) and compute capability 9.0.
"""

from __future__ import annotations

import functools

import torch
import triton

try:  # Gluon is experimental: without it (or on an older triton) the tactic refuses
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # the TMA copies' names: triton 3.6 (the GPU machine's) and later releases differ
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    sync_warps = getattr(gl, "thread_barrier", None) or gl.barrier  # a CTA-wide bar.sync: renamed after 3.6
except ImportError:  # pragma: no cover
    gluon = None

from kiln.kernels.common import (ERF_CLAMP, ERF_P0, ERF_P1, ERF_P2, ERF_P3, ERF_P4, ERF_P5, ERF_Q1, ERF_Q2, ERF_Q3,
                                 ERF_Q4, ERF_Q5, pdl_args, tma_nhwc)
from kiln.kernels.int8_gemm import MAGIC_BITS, ROUND_MAGIC
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

ACTIVATIONS = ("none", "relu", "gelu_erf")
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps")
STREAM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps", "stream")  # stream: programs per SM
STREAM_K = 512  # reductions short enough to stay whole in shared memory: the streaming kernel's
# (BLOCK_M, BLOCK_N, num_warps); 64x64 tiles, three to an SM, first: ResNet-50 b64's layer-3/4 last convs (256 and 512
# deep, 1024 and 2048 wide, a residual) took 14.0 and 12.7 us against 14.8 and 13.5 at the next best tile (H100)
_STREAM = [(64, 64, 4), (128, 128, 8), (128, 64, 4), (64, 128, 4), (128, 128, 4)]
CONV_KEYS = ("BI", "BH", "BW", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps")
# output blocks of BI images x BH x BW pixels (a multiple of 16 rows per warp), best first for ResNet-50 b64 on an
# H100: 128-deep channel blocks in four stages halve the per-step waits (layer 4's 7x7 maps: 21 against 30 us at
# 64); two 7x7 images a tile halve the weight reads from L2 (20.4 us); a 14x14 map in one 16x16 box
_CONV_SPACE = [(1, 8, 8, 128, 128, 4, 4), (2, 8, 8, 128, 128, 4, 8), (1, 16, 16, 128, 128, 4, 8),
               (1, 8, 8, 128, 128, 3, 4), (1, 16, 16, 128, 64, 3, 8), (1, 8, 16, 64, 64, 4, 4),
               (1, 8, 16, 128, 128, 3, 8), (1, 8, 8, 128, 64, 4, 4), (1, 16, 8, 64, 64, 4, 4), (1, 8, 8, 64, 64, 4, 4)]
_SPACE = [(128, 128, 64, 4, 4), (128, 64, 64, 5, 4), (256, 128, 64, 3, 8), (64, 128, 128, 4, 4),
          (128, 128, 128, 3, 8), (64, 64, 64, 4, 4)]  # the last fits a block's default 48 KiB
_SHORT = [(128, 128, 64, 2, 4), (128, 64, 64, 2, 4)]


@functools.lru_cache(maxsize=None)
def multiprocessors(device: torch.device) -> int:
    """The multiprocessors a streaming launch spreads its programs over (4 on the CPU)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def available() -> bool:
    return gluon is not None


if gluon is not None:
    @gluon.jit
    def gdc_start(PDL: gl.constexpr):
        """Under programmatic dependent launch (kernels/common.pdl_args): let the next kernel's programs start, then
        wait until the previous kernel's results are visible. Everything before it must touch only constants."""
        if PDL:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _issue(a_desc, a_coord, w_desc, w_coord, bar, a_dst, w_dst, nbytes: gl.constexpr, pred):
        """One pipeline step's loads: the A (input) and W tiles by TMA, both signalling `bar`."""
        mbarrier.expect(bar, nbytes, pred=pred)
        tma_load(a_desc, a_coord, bar, a_dst, pred=pred)
        tma_load(w_desc, w_coord, bar, w_dst, pred=pred)

    @gluon.jit
    def _issue_conv(x_desc, w_desc, step, c_blocks, n, oh0, ow0, off_n, C, KW, ph, pw, dh, dw, bar, a_dst, w_dst,
                    nbytes: gl.constexpr, pred, SH: gl.constexpr, SW: gl.constexpr):
        """The conv's step `step`: tap step // c_blocks, its channel block; the box of the tap's stride phase
        (x_desc's dims 2 and 4, see `_phase_view`) shifted to the tap (the 8·S keeps the divisions non-negative)."""
        tap = step // c_blocks
        c0 = (step % c_blocks) * x_desc.block_type.shape[4]
        eh = (tap // KW) * dh - ph + 8 * SH
        ew = (tap % KW) * dw - pw + 8 * SW
        _issue(x_desc, [n, oh0 + eh // SH - 8, eh % SH, ow0 + ew // SW - 8, (ew % SW) * C + c0], w_desc,
               [off_n, tap * C + c0], bar, a_dst, w_dst, nbytes, pred)

    @gluon.jit
    def _mma_step(a, w, acc, bar, phase):
        """Wait for a step's tiles, issue its wgmma and wait until only it is in flight (the previous one done, so
        that step's shared-memory slot may be refilled)."""
        mbarrier.wait(bar, phase)
        acc = warpgroup_mma(a, w.permute((1, 0)), acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, w))
        return acc

    @gluon.jit
    def _wgmma_gemm_kernel(a_desc, w_desc, c_desc, res, s_rm, scale, bias, M, N, K, out_inv, res_scale,
                           HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, ACT: gl.constexpr,
                           STAGES: gl.constexpr, PDL: gl.constexpr):
        gdc_start(PDL)
        BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        tiles_m = gl.cdiv(M, BLOCK_M)
        off_m = (gl.program_id(0) % tiles_m) * BLOCK_M
        off_n = (gl.program_id(0) // tiles_m) * BLOCK_N

        a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        w_s = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        nbytes: gl.constexpr = (BLOCK_M + BLOCK_N) * BLOCK_K
        k_tiles = gl.cdiv(K, BLOCK_K)
        for i in gl.static_range(STAGES - 1):  # the first STAGES - 1 tiles in flight
            _issue(a_desc, [off_m, i * BLOCK_K], w_desc, [off_n, i * BLOCK_K], ready.index(i), a_s.index(i),
                   w_s.index(i), nbytes, i < k_tiles)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BLOCK_N, 32])
        acc = gl.zeros((BLOCK_M, BLOCK_N), gl.int32, layout=mma)
        for kb in range(k_tiles):
            s = kb % STAGES
            acc = _mma_step(a_s.index(s), w_s.index(s), acc, ready.index(s), (kb // STAGES) & 1)
            nk = kb + STAGES - 1  # wgmma kb-1 is done: its slot takes tile kb + STAGES - 1
            ns = nk % STAGES
            _issue(a_desc, [off_m, nk * BLOCK_K], w_desc, [off_n, nk * BLOCK_K], ready.index(ns), a_s.index(ns),
                   w_s.index(ns), nbytes, nk < k_tiles)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))

        rm = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
        rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        q = _requant_tile(acc, rm < M, rm * s_rm, rn, rn < N, res, scale, bias, out_inv, res_scale, HAS_BIAS,
                          HAS_RES, ACT)
        c_s = gl.allocate_shared_memory(c_desc.dtype, [BLOCK_M, BLOCK_N], c_desc.layout)
        c_s.store(q)
        fence_async_shared()
        tma_store(c_desc, [off_m, off_n], c_s)
        tma.store_wait(0)

    @gluon.jit
    def _wgmma_stream_kernel(a_desc, w_desc, c_desc, r_desc, scale, bias, M, N, out_inv, res_scale,
                             HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, ACT: gl.constexpr, KT: gl.constexpr,
                             STAGES: gl.constexpr, PDL: gl.constexpr):
        """Persistent GEMM for short reductions (ResNet's 1x1 convs): a program keeps its [BLOCK_N, K] weight block in
        shared memory and walks m-tiles, their rows (and int8 residual tiles) arriving by TMA through a ring of
        STAGES slots, STAGES - 1 tiles ahead of the one multiplied, requantized and stored, so that the memory
        traffic of the epilogue and of the loads overlap."""
        BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        tiles_n = gl.cdiv(N, BLOCK_N)
        step = gl.num_programs(0) // tiles_n  # programs per n-block; those sharing an m-tile run side by side
        off_n = (gl.program_id(0) % tiles_n) * BLOCK_N
        first = gl.program_id(0) // tiles_n
        count = gl.cdiv(gl.cdiv(M, BLOCK_M) - first, step)

        w_s = gl.allocate_shared_memory(w_desc.dtype, [KT, BLOCK_N, BLOCK_K], w_desc.layout)
        a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES * KT, BLOCK_M, BLOCK_K], a_desc.layout)
        r_s = gl.allocate_shared_memory(r_desc.dtype, [STAGES if HAS_RES else 1, BLOCK_M, BLOCK_N], r_desc.layout)
        c_s = gl.allocate_shared_memory(c_desc.dtype, [2, BLOCK_M, BLOCK_N], c_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())  # slots, weights
        for i in gl.static_range(STAGES + 1):
            mbarrier.init(bars.index(i), count=1)
        mbarrier.expect(bars.index(STAGES), KT * BLOCK_N * BLOCK_K)
        for kk in gl.static_range(KT):
            tma_load(w_desc, [off_n, kk * BLOCK_K], bars.index(STAGES), w_s.index(kk))
        gdc_start(PDL)  # the weights load while the previous kernel drains
        nbytes: gl.constexpr = KT * BLOCK_M * BLOCK_K + (BLOCK_M * BLOCK_N if HAS_RES else 0)
        for j in gl.static_range(STAGES - 1):
            _stream_issue(a_desc, r_desc, (first + j * step) * BLOCK_M, off_n, bars.index(j), a_s, r_s, j, nbytes,
                          KT, HAS_RES, j < count)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BLOCK_N, 32])
        rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        n_ok = rn < N
        col_scale = gl.expand_dims(gl.load(scale + rn, mask=n_ok, other=0.0), 0)
        col_bias = gl.expand_dims(gl.load(bias + rn, mask=n_ok, other=0.0), 0)
        mbarrier.wait(bars.index(STAGES), 0)
        for i in range(count):
            s = i % STAGES
            nxt = i + STAGES - 1  # into the slot of tile i - 1, which every warp is past
            sync_warps()
            _stream_issue(a_desc, r_desc, (first + nxt * step) * BLOCK_M, off_n, bars.index(nxt % STAGES), a_s,
                          r_s, nxt % STAGES, nbytes, KT, HAS_RES, nxt < count)
            mbarrier.wait(bars.index(s), (i // STAGES) & 1)
            acc = gl.zeros((BLOCK_M, BLOCK_N), gl.int32, layout=mma)
            for kk in gl.static_range(KT):
                acc = warpgroup_mma(a_s.index(s * KT + kk), w_s.index(kk).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            v = acc.to(gl.float32) * col_scale
            if HAS_BIAS:
                v += col_bias
            if HAS_RES:
                v += r_s.index(s).load(mma).to(gl.float32) * res_scale
            q = activate_requant(v, out_inv, ACT)
            store_tile(q, c_s.index(i % 2), c_s.index(i % 2), c_desc, [(first + i * step) * BLOCK_M, off_n])
        tma.store_wait(0)
        for i in gl.static_range(STAGES + 1):
            mbarrier.invalidate(bars.index(i))

    @gluon.jit
    def store_tile(q, view, buf, c_desc, coord):
        """A persistent kernel's output tile q into `view` of the double-buffered `buf` (once the TMA store that
        used it two tiles ago has left), then stored by TMA from `buf` at `coord`."""
        tma.store_wait(1)
        sync_warps()
        view.store(q)
        fence_async_shared()
        sync_warps()  # the whole tile is in shared memory before one thread stores it
        tma_store(c_desc, coord, buf)

    @gluon.jit
    def _stream_issue(a_desc, r_desc, off_m, off_n, bar, a_s, r_s, stage, nbytes: gl.constexpr, KT: gl.constexpr,
                      HAS_RES: gl.constexpr, pred):
        """The streaming kernel's loads for one m-tile into `stage`: its KT row blocks and its residual tile."""
        mbarrier.expect(bar, nbytes, pred=pred)
        for kk in gl.static_range(KT):
            tma_load(a_desc, [off_m, kk * a_desc.block_type.shape[1]], bar, a_s.index(stage * KT + kk), pred=pred)
        if HAS_RES:
            tma_load(r_desc, [off_m, off_n], bar, r_s.index(stage), pred=pred)

    @gluon.jit
    def _requant_tile(acc, rows_ok, res_off, rn, n_ok, res, scale, bias, out_inv, res_scale, HAS_BIAS: gl.constexpr,
                      HAS_RES: gl.constexpr, ACT: gl.constexpr):
        """kernels/int8_gemm.epilogue's int8 values of an accumulator tile: fp32(acc)·scale[n] + bias[n] (+ the int8
        residual at `res_off` + n times res_scale), the activation, requantized (rounded by the 1.5·2²³ add)."""
        v = acc.to(gl.float32) * gl.expand_dims(gl.load(scale + rn, mask=n_ok, other=0.0), 0)
        if HAS_BIAS:
            v += gl.expand_dims(gl.load(bias + rn, mask=n_ok, other=0.0), 0)
        if HAS_RES:
            mask = gl.expand_dims(rows_ok, 1) & gl.expand_dims(n_ok, 0)
            r = gl.load(res + gl.expand_dims(res_off, 1) + gl.expand_dims(rn, 0), mask=mask, other=0)
            v += r.to(gl.float32) * res_scale
        return activate_requant(v, out_inv, ACT)

    @gluon.jit
    def erf(x):
        """kernels/common.erf in Gluon: the same rational fit, constants and clamp. A copy, because a triton.jit
        function that Gluon calls must be compiled, and under TRITON_INTERPRET (the CPU tests) it is not."""
        inside = gl.abs(x) < ERF_CLAMP
        x = gl.minimum(gl.maximum(x, -ERF_CLAMP), ERF_CLAMP)
        u = x * x
        p = gl.fma(gl.fma(gl.fma(gl.fma(gl.fma(u, ERF_P5, ERF_P4), u, ERF_P3), u, ERF_P2), u, ERF_P1), u, ERF_P0)
        q = gl.fma(gl.fma(gl.fma(gl.fma(gl.fma(u, ERF_Q5, ERF_Q4), u, ERF_Q3), u, ERF_Q2), u, ERF_Q1), u, 1.0)
        return gl.where(inside, gl.fdiv(x * p, q), gl.where(x < 0, -1.0, 1.0))

    @gluon.jit
    def activate_requant(v, out_inv, ACT: gl.constexpr):
        """The activation, then int8 at out_inv: clamped to ±127, rounded half to even by the 1.5·2²³ add. ReLU is
        the clamp's lower bound (relu(v)·out_inv = max(v·out_inv, 0) for out_inv > 0: one instruction fewer)."""
        if ACT == "relu":
            q = gl.minimum(gl.maximum(v * out_inv, 0.0), 127.0)
        else:
            if ACT == "gelu_erf":
                v = 0.5 * v * (1.0 + erf(v * 0.7071067811865476))
            q = gl.minimum(gl.maximum(v * out_inv, -127.0), 127.0)
        return ((q + ROUND_MAGIC).to(gl.int32, bitcast=True) - MAGIC_BITS).to(gl.int8)

    @gluon.jit
    def _wgmma_conv_kernel(x_desc, w_desc, scale, bias, res, y, N, OH, OW, CO, C, KW, ph, pw, dh, dw, out_inv,
                           res_scale, s_rn, s_rh, s_rw, s_yn, s_yh, s_yw, NUM_K, HAS_BIAS: gl.constexpr,
                           HAS_RES: gl.constexpr, ACT: gl.constexpr, STAGES: gl.constexpr, SH: gl.constexpr,
                           SW: gl.constexpr, PDL: gl.constexpr):
        """Implicit-GEMM conv: per step a 5-D TMA box [BI, BH, 1, BW, BLOCK_K] of the input's phase view (BI images,
        zero fill is the padding), seen as [BI·BH·BW, BLOCK_K] in shared memory and fed to wgmma from there, one
        wgmma in flight; channels contiguous in y and the residual (NHWC)."""
        gdc_start(PDL)
        BI: gl.constexpr = x_desc.block_type.shape[0]
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[3]
        BLOCK_K: gl.constexpr = x_desc.block_type.shape[4]
        BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
        BM: gl.constexpr = BI * BH * BW
        tiles_w = gl.cdiv(OW, BW)
        tiles_hw = gl.cdiv(OH, BH) * tiles_w
        pid = gl.program_id(0)
        n = pid // tiles_hw * BI
        oh0 = (pid % tiles_hw) // tiles_w * BH
        ow0 = (pid % tiles_w) * BW
        off_n = gl.program_id(1) * BLOCK_N
        c_blocks = gl.cdiv(C, BLOCK_K)

        a_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BI, BH, 1, BW, BLOCK_K], x_desc.layout)
        w_s = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        nbytes: gl.constexpr = (BM + BLOCK_N) * BLOCK_K
        for i in gl.static_range(STAGES - 1):
            _issue_conv(x_desc, w_desc, i, c_blocks, n, oh0, ow0, off_n, C, KW, ph, pw, dh, dw, ready.index(i),
                        a_s.index(i), w_s.index(i), nbytes, i < NUM_K, SH, SW)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BLOCK_N, 32])
        acc = gl.zeros((BM, BLOCK_N), gl.int32, layout=mma)
        for kb in range(NUM_K):
            s = kb % STAGES
            acc = _mma_step(a_s.index(s).reshape([BM, BLOCK_K]), w_s.index(s), acc, ready.index(s),
                            (kb // STAGES) & 1)
            nk = kb + STAGES - 1
            _issue_conv(x_desc, w_desc, nk, c_blocks, n, oh0, ow0, off_n, C, KW, ph, pw, dh, dw,
                        ready.index(nk % STAGES), a_s.index(nk % STAGES), w_s.index(nk % STAGES), nbytes, nk < NUM_K,
                        SH, SW)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))

        i = gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
        img, oh, ow = n + i // (BH * BW), oh0 + (i % (BH * BW)) // BW, ow0 + i % BW
        rn = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        rows_ok = (img < N) & (oh < OH) & (ow < OW)
        q = _requant_tile(acc, rows_ok, img * s_rn + oh * s_rh + ow * s_rw, rn, rn < CO, res, scale, bias, out_inv,
                          res_scale, HAS_BIAS, HAS_RES, ACT)
        y_off = gl.expand_dims(img * s_yn + oh * s_yh + ow * s_yw, 1) + gl.expand_dims(rn, 0)
        gl.store(y + y_off, q, mask=gl.expand_dims(rows_ok, 1) & gl.expand_dims(rn < CO, 0))


def configs(m: int | None, n: int, k: int, smem: int) -> list[dict]:
    """Tiles whose STAGES operand tiles and output tile fit `smem` and whose N does not dwarf the problem; for a
    reduction of one or two blocks (ResNet's 64- and 128-channel 1x1 convs) two-stage tiles first, whose smaller
    shared memory lets more programs share an SM."""
    out = []
    for t in (_SHORT if k <= 128 else []) + _SPACE:
        cfg = dict(zip(CONFIG_KEYS, t))
        need = cfg["STAGES"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] + cfg["BLOCK_M"] * cfg["BLOCK_N"]
        if need <= smem and (cfg["BLOCK_N"] <= max(64, n) or t == _SPACE[0]):
            out.append(cfg)
    return out


def stream_configs(n: int, k: int, smem: int, residual: bool) -> list[dict]:
    """The streaming kernel's tiles for a reduction of at most STREAM_K (whole 32-wide steps, whole 128-wide boxes past
    128): its weight block, STAGES slots of rows (and residual tiles) and two output tiles fitting `smem`, two slots
    (more programs to an SM: up to three of the smallest tile, two of the others) and four (more bytes in flight
    per program); none for longer reductions."""
    bk = min(k, 128)  # one TMA box is at most 128 bytes wide (its swizzle); one wgmma takes 32 of K
    if k > STREAM_K or k % 32 or k % bk:
        return []
    out = []
    for stages in (2, 4):
        for bm, bn, warps in _STREAM:
            need = stream_smem(bm, bn, k, stages, residual)
            if need <= smem and bn <= max(64, n):
                per_sm = next(p for p in (3, 2, 1) if p == 1 or p * (need + 1024) <= smem)  # as many as fit
                if (bm, bn) != (64, 64):
                    per_sm = min(per_sm, 2)  # three of the larger tiles were never faster
                out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages, "num_warps": warps,
                            "stream": per_sm})
    return out


def stream_smem(bm: int, bn: int, k: int, stages: int, residual: bool) -> int:
    """The streaming kernel's shared memory: weight block, `stages` row slots (and residual tiles), two output tiles."""
    return stages * bm * k + bn * k + (2 + stages * residual) * bm * bn


def desc(t: torch.Tensor, block: list[int]):
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.int8))


def matmul(a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, *, out_scale: float, res_scale: float | None = None,
           activation: str = "none", config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """int8 a [M, K] @ w [N, K]ᵀ (K contiguous, 16-byte rows) requantized to int8 at out_scale; `residual` is int8
    [M, N] read with res_scale. ValueError for what it does not take (the tactic checks first)."""
    if not available():
        raise ValueError("this triton has no Gluon")
    if activation not in ACTIVATIONS or a.dtype != torch.int8 or w.dtype != torch.int8:
        raise ValueError(f"int8 operands and one of the activations {ACTIVATIONS} only")
    if residual is not None and (residual.dtype != torch.int8 or res_scale is None):
        raise ValueError("the residual must be int8 with a res_scale")
    (m, k), n = a.shape, w.shape[0]
    c = take(out, (m, n), torch.int8, a.device)
    if m == 0 or n == 0:
        return c
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    r = residual if residual is not None else c
    if config.get("stream"):
        if k > STREAM_K or k % bk:
            raise ValueError(f"the streaming kernel takes reductions of at most {STREAM_K}, in whole blocks")
        if r.stride(1) != 1 or r.stride(0) % 16:
            raise ValueError("the streaming kernel reads the residual by TMA: dense rows of 16-byte multiples only")
        tiles_n = triton.cdiv(n, bn)
        per_n = max(1, min(triton.cdiv(m, bm), config["stream"] * multiprocessors(a.device) // tiles_n))
        _wgmma_stream_kernel[(tiles_n * per_n,)](
            desc(a, [bm, bk]), desc(w, [bn, bk]), desc(c, [bm, bn]), desc(r, [bm, bn]), scale,
            bias if bias is not None else scale, m, n, inv_scale(out_scale), float(res_scale or 1.0),
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation, KT=k // bk,
            STAGES=config.get("STAGES", 2), num_warps=config["num_warps"], enable_fp_fusion=False,
            **pdl_args(a.device))
        return c
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _wgmma_gemm_kernel[grid](desc(a, [bm, bk]), desc(w, [bn, bk]), desc(c, [bm, bn]), r, r.stride(0), scale,
                             bias if bias is not None else scale, m, n, k, inv_scale(out_scale),
                             float(res_scale or 1.0), HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                             ACT=activation, STAGES=config["STAGES"], num_warps=config["num_warps"],
                             **pdl_args(a.device),
                             enable_fp_fusion=False)  # products and sums rounded apart, as the reference
    return c


def conv_configs(oh: int | None, ow: int | None, co: int, c: int, smem: int) -> list[dict]:
    """Conv tiles whose STAGES input boxes and weight tiles fit `smem` and do not dwarf the output map (a box of
    several images only where one image fits it whole) or the channels; the first always."""
    out = []
    for t in _CONV_SPACE:
        cfg = dict(zip(CONV_KEYS, t))
        need = cfg["STAGES"] * (cfg["BI"] * cfg["BH"] * cfg["BW"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]
        fits = cfg["BH"] <= max(8, triton.next_power_of_2(oh or 8)) and cfg["BLOCK_N"] <= max(64, co) and \
            cfg["BW"] <= max(8, triton.next_power_of_2(ow or 8)) and cfg["BLOCK_K"] <= max(32, c) and \
            (cfg["BI"] == 1 or (oh is not None and ow is not None and oh <= cfg["BH"] and ow <= cfg["BW"]))
        if need <= smem and (fits or t == _CONV_SPACE[0]):
            out.append(cfg)
    return out


def phase_view(x: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """NHWC x [N, H, W, C] as [N, H/sh, sh, W/sw, sw·C]: input row sh·i + a is (i, a), column sw·j + b is j with
    channels offset b·C, so that each stride phase of a strided conv is a plain box (TMA has no element strides)."""
    n, h, w, c = x.shape
    return x.as_strided((n, h // sh, sh, w // sw, sw * c),
                        (x.stride(0), sh * x.stride(1), x.stride(1), sw * x.stride(2), 1))


def conv2d(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor, kernel: tuple[int, int], pads, dilations,
           bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, out_scale: float,
           res_scale: float | None = None, activation: str = "none", config: dict,
           out: torch.Tensor | None = None, strides=(1, 1)) -> torch.Tensor:
    """The int8 conv of x [N, C, H, W] (NHWC memory TMA can address, C a multiple of 16; strided: H and W multiples
    of the strides, pixels dense, C a multiple of BLOCK_K) with `w_packed` (kernels/int8_conv.pack_weight), pads
    [top, left, bottom, right], requantized to int8 at out_scale; kernels/int8_conv.conv2d's bits. NCHW-shaped,
    channels_last. ValueError for what it does not take."""
    if not available():
        raise ValueError("this triton has no Gluon")
    if activation not in ACTIVATIONS or x.dtype != torch.int8 or w_packed.dtype != torch.int8:
        raise ValueError(f"int8 operands and one of the activations {ACTIVATIONS} only")
    (n, c, h, wd), (kh, kw), co, (sh, sw) = x.shape, kernel, w_packed.shape[1], strides
    bi, bh, bw, bn, bk = config.get("BI", 1), config["BH"], config["BW"], config["BLOCK_N"], config["BLOCK_K"]
    if not tma_nhwc(x) or c % 16:
        raise ValueError("x must be NHWC memory TMA can address, with a multiple of 16 channels (16-byte rows)")
    if (sh, sw) != (1, 1) and (h % sh or wd % sw or c % bk or (sw > 1 and x.stride(3) != c)):
        raise ValueError("a strided conv needs H and W multiples of the strides, dense pixels and C a multiple of "
                         "BLOCK_K")
    if max(pads[0], pads[2]) >= 8 * sh or max(pads[1], pads[3]) >= 8 * sw:
        raise ValueError("pads of 8·stride or more")
    if residual is not None and (residual.dtype != torch.int8 or res_scale is None or residual.stride(1) != 1):
        raise ValueError("the residual must be int8, channels_last, with a res_scale")
    dh, dw = dilations
    oh = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    y = take(out, (n, co, oh, ow), torch.int8, x.device, torch.channels_last)
    if y.numel() == 0:
        return y
    view = phase_view(x.permute(0, 2, 3, 1), sh, sw)
    block = [bi, bh, 1, bw, bk]
    x_desc = TensorDescriptor(view, list(view.shape), list(view.stride()), block,
                              gl.NVMMASharedLayout.get_default_for(block, gl.int8))
    r = residual if residual is not None else y
    grid = (triton.cdiv(n, bi) * triton.cdiv(oh, bh) * triton.cdiv(ow, bw), triton.cdiv(co, bn))
    _wgmma_conv_kernel[grid](x_desc, desc(w_packed.t(), [bn, bk]), scale, bias if bias is not None else scale, r, y,
                             n, oh, ow, co, c, kw, pads[0], pads[1], dh, dw, inv_scale(out_scale),
                             float(res_scale or 1.0), r.stride(0), r.stride(2), r.stride(3), y.stride(0), y.stride(2),
                             y.stride(3), kh * kw * triton.cdiv(c, bk), HAS_BIAS=bias is not None,
                             HAS_RES=residual is not None, ACT=activation, STAGES=config["STAGES"], SH=sh, SW=sw,
                             num_warps=config["num_warps"], enable_fp_fusion=False, **pdl_args(x.device))
    return y
