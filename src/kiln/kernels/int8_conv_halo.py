"""Stride-1 KHxKW int8 conv for Hopper in Gluon that reads each input pixel from L2 KW times, not KH·KW: for a tile of
BH x BW output pixels and one channel block it loads, per kernel column s, the halo box of BH + KH - 1 input rows
shifted by s, and feeds wgmma tap (r, s) as that box's rows r·BW onwards (a contiguous, swizzle-aligned view of
shared memory). The TMA conv (kernels/int8_gemm_wgmma.py) loads one box per tap and, for 64-channel layers, is
bound by L2 bandwidth; the pointer conv leans on L1 instead. It also runs the space-to-depth stem's 4x1 conv over
overlapping rows (tactics/triton_int8_s2d.py, registered by tactics/quant_conv.py).

The program is persistent: its weight block [KH·KW·C, BLOCK_N] stays in shared memory, the next tile's boxes load
while this tile is multiplied, and the requantized tile leaves by a TMA store (clipped at the map's edge).
Arithmetic as kernels/int8_gemm_wgmma.py, so kernels/int8_conv.py's bits.
"""

from __future__ import annotations

import torch
import triton

from kiln.kernels import int8_gemm_wgmma as wg
from kiln.kernels.common import pdl_args, tma_nhwc, widest_block
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

CONFIG_KEYS = ("BH", "BW", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps", "stream")
# (BH, BW, BLOCK_N): 8x8 (two programs to a multiprocessor: 56-wide maps), 4x32 (28-wide maps), 128-pixel tiles,
# 32 channels where a 256-channel layer's weight block is too big at 64; one warpgroup (four warps), so that the
# wgmma wait before a refill covers every reader of the slot
_SPACE = [(8, 8, 64), (4, 32, 64), (16, 8, 64), (8, 16, 64), (16, 8, 128), (8, 16, 128), (8, 8, 32), (16, 8, 32)]
BARRIER_BYTES = 64  # the mbarriers, per program


UNAVAILABLE = "this triton's Gluon cannot view shared memory from inside a buffer (triton 3.6 can)"


def available() -> bool:
    """Gluon whose shared-memory views may start inside a buffer (`_rows_at`): triton 3.6's."""
    return wg.gluon is not None and hasattr(wg.gl.shared_memory_descriptor, "_reinterpret")

if wg.gluon is not None:
    gluon, gl = wg.gluon, wg.gl
    mbarrier, tma = wg.mbarrier, wg.tma

    @gluon.jit
    def _halo_issue(x_desc, t_desc, u, CB, first, step, tiles_w, tiles_hw, ph, pw, bar, a_s, stage,
                    nbytes: gl.constexpr, pred, KW: gl.constexpr):
        """Unit u's loads (the program's tile u // CB, channel block u % CB): per kernel column s, the halo box of
        BH + T input rows at column offset s - pw, as a BH-row box and a T-row box (T ≥ KH - 1, box sides are
        powers of two) in consecutive rows of the stage's part of a_s."""
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[2]
        BK: gl.constexpr = x_desc.block_type.shape[3]
        T: gl.constexpr = t_desc.block_type.shape[1]
        t = first + (u // CB) * step
        c0 = (u % CB) * BK
        n = t // tiles_hw
        ih = (t % tiles_hw) // tiles_w * BH - ph
        iw = (t % tiles_w) * BW - pw
        mbarrier.expect(bar, nbytes, pred=pred)
        for s in gl.static_range(KW):
            g = (stage * KW + s) * (BH + T) * BW // 8
            wg.tma_load(x_desc, [n, ih, iw + s, c0], bar, _rows_at(a_s, g, [1, BH, BW, BK]), pred=pred)
            wg.tma_load(t_desc, [n, ih + BH, iw + s, c0], bar, _rows_at(a_s, g + BH * BW // 8, [1, T, BW, BK]),
                         pred=pred)

    @gluon.jit
    def _rows_at(a_s, group, shape: gl.constexpr):
        """A view of `shape` (NVMMA layout) whose first row is row 8·group of the [groups, 8, BK] buffer a_s: views
        start on any 8-row boundary (the swizzle's period), which subslices, whose offsets must be multiples of
        the view, do not allow. Triton 3.6 lowers this to the slot's address; later releases reject a view past
        the indexed slot (`available`)."""
        return a_s.index(group)._reinterpret(a_s.dtype, shape, gl.NVMMASharedLayout.get_default_for(shape, gl.int8))

    @gluon.jit
    def _halo_conv_kernel(x_desc, t_desc, w_desc, y_desc, r_desc, scale, bias, CO, ph, pw, out_inv, res_scale,
                          tiles_w, tiles_hw, tiles, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr,
                          ACT: gl.constexpr, KH: gl.constexpr, KW: gl.constexpr, CB: gl.constexpr,
                          STAGES: gl.constexpr, PDL: gl.constexpr):
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[2]
        BK: gl.constexpr = x_desc.block_type.shape[3]
        T: gl.constexpr = t_desc.block_type.shape[1]  # halo rows loaded below the BH-row box: at least KH - 1
        BN: gl.constexpr = w_desc.block_type.shape[0]
        BM: gl.constexpr = BH * BW
        tiles_n = gl.cdiv(CO, BN)
        step = gl.num_programs(0) // tiles_n  # programs per n-block; those sharing a tile run side by side
        off_n = (gl.program_id(0) % tiles_n) * BN
        first = gl.program_id(0) // tiles_n
        count = gl.cdiv(tiles - first, step)
        units = count * CB

        w_s = gl.allocate_shared_memory(w_desc.dtype, [KH * KW * CB, BN, BK], w_desc.layout)
        a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.int8)
        a_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES * KW * (BH + T) * BW // 8, 8, BK], a_layout)
        c_s = gl.allocate_shared_memory(y_desc.dtype, [2, 1, BH, BW, BN], y_desc.layout)
        r_s = gl.allocate_shared_memory(r_desc.dtype, [1, 1, BH, BW, BN], r_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES + 2, 1], mbarrier.MBarrierLayout())  # stages, w, res
        for i in gl.static_range(STAGES + 2):
            mbarrier.init(bars.index(i), count=1)
        mbarrier.expect(bars.index(STAGES), KH * KW * CB * BN * BK)
        for j in gl.static_range(KH * KW * CB):  # column j·BK of [CO, KH·KW·C]: tap j // CB, channel block j % CB
            wg.tma_load(w_desc, [off_n, j * BK], bars.index(STAGES), w_s.index(j))
        wg.gdc_start(PDL)  # the weights load while the previous kernel drains
        nbytes: gl.constexpr = KW * (BH + T) * BW * BK
        for i in gl.static_range(STAGES - 1):
            _halo_issue(x_desc, t_desc, i, CB, first, step, tiles_w, tiles_hw, ph, pw, bars.index(i), a_s, i,
                        nbytes, i < units, KW)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BN, 32])
        rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        n_ok = rn < CO
        col_scale = gl.expand_dims(gl.load(scale + rn, mask=n_ok, other=0.0), 0)
        col_bias = gl.expand_dims(gl.load(bias + rn, mask=n_ok, other=0.0), 0)
        mbarrier.wait(bars.index(STAGES), 0)
        for i in range(count):
            t = first + i * step
            n = t // tiles_hw
            oh0 = (t % tiles_hw) // tiles_w * BH
            ow0 = (t % tiles_w) * BW
            if HAS_RES:  # every warp read the previous tile's residual before the last barrier of its epilogue
                mbarrier.expect(bars.index(STAGES + 1), BM * BN)
                wg.tma_load(r_desc, [n, oh0, ow0, off_n], bars.index(STAGES + 1), r_s.index(0))
            acc = gl.zeros((BM, BN), gl.int32, layout=mma)
            for cb in range(CB):
                u = i * CB + cb
                st = u % STAGES
                mbarrier.wait(bars.index(st), (u // STAGES) & 1)
                for r in gl.static_range(KH):
                    for s in gl.static_range(KW):
                        a = _rows_at(a_s, ((st * KW + s) * (BH + T) + r) * BW // 8, [BM, BK])
                        acc = wg.warpgroup_mma(a, w_s.index((r * KW + s) * CB + cb).permute((1, 0)), acc,
                                               is_async=True)
                # the previous unit's wgmmas are done (this unit's KH·KW run on): its slot takes unit u + STAGES - 1
                acc = wg.warpgroup_mma_wait(num_outstanding=KH * KW, deps=(acc,))
                nu = u + STAGES - 1
                _halo_issue(x_desc, t_desc, nu, CB, first, step, tiles_w, tiles_hw, ph, pw,
                            bars.index(nu % STAGES), a_s, nu % STAGES, nbytes, nu < units, KW)
            acc = wg.warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            v = acc.to(gl.float32) * col_scale
            if HAS_BIAS:
                v += col_bias
            if HAS_RES:
                mbarrier.wait(bars.index(STAGES + 1), i & 1)
                v += r_s.index(0).reshape([BM, BN]).load(mma).to(gl.float32) * res_scale
            q = wg.activate_requant(v, out_inv, ACT)
            buf = c_s.index(i % 2)
            wg.store_tile(q, buf.reshape([BM, BN]), buf, y_desc, [n, oh0, ow0, off_n])
        tma.store_wait(0)
        for i in gl.static_range(STAGES + 2):
            mbarrier.invalidate(bars.index(i))


def halo_rows(kh: int) -> int:
    """The rows loaded below a tile's BH-row box: KH - 1 rounded up to a power of two (a TMA box side)."""
    return triton.next_power_of_2(kh - 1)


def rows(cfg: dict, kernel: tuple[int, int]) -> int:
    """The stage buffers' rows: STAGES·KW halo boxes of BH + T rows of BW pixels."""
    return cfg["STAGES"] * kernel[1] * (cfg["BH"] + halo_rows(kernel[0])) * cfg["BW"]


def smem_bytes(cfg: dict, kernel: tuple[int, int], c: int, residual: bool) -> int:
    """Shared memory of one program: the weight block, the stage buffers, two output tiles (and a residual tile)."""
    bm, bn, bk = cfg["BH"] * cfg["BW"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    return kernel[0] * kernel[1] * c * bn + rows(cfg, kernel) * bk + (2 + residual) * bm * bn + BARRIER_BYTES


def configs(kernel: tuple[int, int], oh: int | None, ow: int | None, co: int, c: int, smem: int,
            residual: bool) -> list[dict]:
    """Tiles with three or two stages whose weight block, halo boxes and output tiles fit `smem` (as many programs to
    a multiprocessor as fit, up to four) and that do not dwarf the map or the channels, each with the widest channel
    block that fits (128-byte box rows beat 64-byte ones at every 128- and 256-channel tile probed, even at one
    stage fewer); none when C or CO is not a multiple of 16 or the kernel has one row (a GEMM: no halo to share)."""
    if c % 16 or co % 16 or kernel[0] < 2:
        return []
    bks = [bk for bk in (128, 64) if c % bk == 0] or [c if c < 64 else 16]
    out = []
    for stages in (3, 2):
        for bh, bw, bn in _SPACE:
            if bn > max(64, co) or bw > max(8, triton.next_power_of_2(ow or 8)) or bh > max(
                    4, triton.next_power_of_2(oh or 4)):
                continue
            cfg = widest_block({"BH": bh, "BW": bw, "BLOCK_N": bn}, {"STAGES": stages, "num_warps": 4}, bks,
                               lambda cfg: smem_bytes(cfg, kernel, c, residual), smem)
            if cfg:
                out.append(cfg)
    return out


def conv2d(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor, kernel: tuple[int, int], pads,
           bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, out_scale: float,
           res_scale: float | None = None, activation: str = "none", config: dict,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """The stride-1, dilation-1 KHxKW int8 conv (KH ≥ 2) of x [N, C, H, W] (NHWC memory TMA can address, C a
    multiple of BLOCK_K) with `w_packed` (kernels/int8_conv.pack_weight), pads [top, left, bottom, right],
    requantized to int8 at out_scale; kernels/int8_conv.conv2d's bits. NCHW-shaped, channels_last. ValueError for
    what it does not take."""
    if not available():
        raise ValueError(UNAVAILABLE)
    if activation not in wg.ACTIVATIONS or x.dtype != torch.int8 or w_packed.dtype != torch.int8:
        raise ValueError(f"int8 operands and one of the activations {wg.ACTIVATIONS} only")
    (n, c, h, wd), (kh, kw), co = x.shape, kernel, w_packed.shape[1]
    bh, bw, bn, bk = config["BH"], config["BW"], config["BLOCK_N"], config["BLOCK_K"]
    if kh < 2 or c % bk or co % 16:
        raise ValueError("kernels of two or more rows, C a multiple of BLOCK_K and CO of 16 only")
    if not tma_nhwc(x):
        raise ValueError("x must be NHWC memory with 16-byte pixel and row strides")
    if residual is not None and (residual.dtype != torch.int8 or res_scale is None or
                                 not residual.is_contiguous(memory_format=torch.channels_last)):
        raise ValueError("the residual must be int8, channels_last, with a res_scale")
    oh, ow = h + pads[0] + pads[2] - kh + 1, wd + pads[1] + pads[3] - kw + 1
    y = take(out, (n, co, oh, ow), torch.int8, x.device, torch.channels_last)
    if y.numel() == 0:
        return y
    if not y.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("the output buffer must be channels_last")
    nhwc, y4 = x.permute(0, 2, 3, 1), y.permute(0, 2, 3, 1)
    r4 = (residual if residual is not None else y).permute(0, 2, 3, 1)
    w = w_packed.t()
    tiles_w, tiles_hw = triton.cdiv(ow, bw), triton.cdiv(oh, bh) * triton.cdiv(ow, bw)
    tiles, tiles_n = n * tiles_hw, triton.cdiv(co, bn)
    per_n = max(1, min(tiles, config["stream"] * wg.multiprocessors(x.device) // tiles_n))
    _halo_conv_kernel[(tiles_n * per_n,)](
        wg.desc(nhwc, [1, bh, bw, bk]), wg.desc(nhwc, [1, halo_rows(kh), bw, bk]), wg.desc(w, [bn, bk]),
        wg.desc(y4, [1, bh, bw, bn]), wg.desc(r4, [1, bh, bw, bn]), scale, bias if bias is not None else scale, co,
        pads[0], pads[1], inv_scale(out_scale), float(res_scale or 1.0), tiles_w, tiles_hw, tiles,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation, KH=kh, KW=kw, CB=c // bk,
        STAGES=config["STAGES"], num_warps=config["num_warps"], enable_fp_fusion=False, **pdl_args(x.device))
    return y
