"""Two 1x1 int8 convs of one output map summed under one epilogue (kinds/quantized.QuantConvPair: a bottleneck's
last conv and its downsample), in Gluon for Hopper. Persistent, as the streaming GEMM: a program keeps both convs'
weight blocks for its BLOCK_N channels in shared memory and walks output tiles (BH x BW pixels), their input
boxes (4-D TMA, the first input's channel blocks then the second's) arriving through a ring of STAGES slots while
earlier ones feed wgmma; per tile v = (fp32(acc)·scale + bias) + (fp32(acc2)·scale2 + bias2), the activation,
int8 out by a double-buffered TMA store. Either input may be a strided view (a strided conv's subsample,
kernels/common.tma_nhwc).
"""

from __future__ import annotations

import torch
import triton

from kiln.kernels import int8_gemm_wgmma as wg
from kiln.kernels.common import pdl_args, tma_nhwc, widest_block
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

CONFIG_KEYS = ("BH", "BW", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps", "stream")
# (BH, BW, BLOCK_N, num_warps): v and the second accumulator, both [BH·BW, BLOCK_N], live at once: at most 64 values
# each per thread; with two warpgroups a CTA barrier after each wgmma wait makes a slot's refill wait for both;
# 4x32 for 28-wide maps (12 % of a 32-wide tile idle, against 23 % of 8 or 16)
_SPACE = [(8, 16, 128, 8), (16, 8, 128, 8), (16, 16, 64, 8), (4, 32, 128, 8), (8, 16, 64, 4), (16, 8, 64, 4),
          (4, 32, 64, 4), (8, 8, 128, 4), (8, 8, 64, 4)]
BARRIER_BYTES = 64


def available() -> bool:
    return wg.available()


if wg.gluon is not None:
    gluon, gl = wg.gluon, wg.gl
    mbarrier, tma = wg.mbarrier, wg.tma

    @gluon.jit
    def _pair_issue(x_desc, x2_desc, u, KT1: gl.constexpr, KT: gl.constexpr, first, step, tiles_w, tiles_hw, bar,
                    dst, pred):
        """Unit u's input box (the program's tile u // KT, channel block u % KT: the first input's, then the
        second's)."""
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[2]
        BK: gl.constexpr = x_desc.block_type.shape[3]
        t = first + (u // KT) * step
        k = u % KT
        n = t // tiles_hw
        oh0 = (t % tiles_hw) // tiles_w * BH
        ow0 = (t % tiles_w) * BW
        mbarrier.expect(bar, BH * BW * BK, pred=pred)
        wg.tma_load(x_desc, [n, oh0, ow0, k * BK], bar, dst, pred=pred & (k < KT1))
        wg.tma_load(x2_desc, [n, oh0, ow0, (k - KT1) * BK], bar, dst, pred=pred & (k >= KT1))

    @gluon.jit
    def _col(ptr, rn, n_ok):
        return gl.expand_dims(gl.load(ptr + rn, mask=n_ok, other=0.0), 0)

    @gluon.jit
    def _pair_units(x_desc, x2_desc, a_s, w_s, bars, acc, i, k0, KS: gl.constexpr, KT1: gl.constexpr,
                    KT: gl.constexpr, STAGES: gl.constexpr, first, step, tiles_w, tiles_hw, units):
        """Tile i's units k0 .. k0 + KS - 1 into acc, one wgmma in flight: each refills the slot of the one before."""
        BM: gl.constexpr = x_desc.block_type.shape[1] * x_desc.block_type.shape[2]
        BK: gl.constexpr = x_desc.block_type.shape[3]
        for kb in range(KS):
            u = i * KT + k0 + kb
            st = u % STAGES
            mbarrier.wait(bars.index(st), (u // STAGES) & 1)
            acc = wg.warpgroup_mma(a_s.index(st).reshape([BM, BK]), w_s.index(k0 + kb).permute((1, 0)), acc,
                                   is_async=True)
            acc = wg.warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            if gl.num_warps() > 4:  # the other warpgroup's wgmma u - 1 is done too before its slot refills
                wg.sync_warps()
            nu = u + STAGES - 1
            _pair_issue(x_desc, x2_desc, nu, KT1, KT, first, step, tiles_w, tiles_hw, bars.index(nu % STAGES),
                        a_s.index(nu % STAGES), nu < units)
        return wg.warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    @gluon.jit
    def _pair_kernel(x_desc, w_desc, x2_desc, w2_desc, y_desc, scale, bias, scale2, bias2, CO, out_inv, tiles_w,
                     tiles_hw, tiles, HAS_BIAS: gl.constexpr, HAS_BIAS2: gl.constexpr, ACT: gl.constexpr,
                     KT1: gl.constexpr, KT2: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr):
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[2]
        BK: gl.constexpr = x_desc.block_type.shape[3]
        BN: gl.constexpr = w_desc.block_type.shape[0]
        BM: gl.constexpr = BH * BW
        KT: gl.constexpr = KT1 + KT2
        tiles_n = gl.cdiv(CO, BN)
        step = gl.num_programs(0) // tiles_n  # programs per n-block; those sharing a tile run side by side
        off_n = (gl.program_id(0) % tiles_n) * BN
        first = gl.program_id(0) // tiles_n
        count = gl.cdiv(tiles - first, step)
        units = count * KT

        w_s = gl.allocate_shared_memory(w_desc.dtype, [KT, BN, BK], w_desc.layout)
        a_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES, 1, BH, BW, BK], x_desc.layout)
        c_s = gl.allocate_shared_memory(y_desc.dtype, [2, 1, BH, BW, BN], y_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())  # stages, weights
        for i in gl.static_range(STAGES + 1):
            mbarrier.init(bars.index(i), count=1)
        mbarrier.expect(bars.index(STAGES), KT * BN * BK)
        for j in gl.static_range(KT1):
            wg.tma_load(w_desc, [off_n, j * BK], bars.index(STAGES), w_s.index(j))
        for j in gl.static_range(KT2):
            wg.tma_load(w2_desc, [off_n, j * BK], bars.index(STAGES), w_s.index(KT1 + j))
        wg.gdc_start(PDL)  # the weights load while the previous kernel drains
        for i in gl.static_range(STAGES - 1):
            _pair_issue(x_desc, x2_desc, i, KT1, KT, first, step, tiles_w, tiles_hw, bars.index(i), a_s.index(i),
                        i < units)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BN, 32])
        rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        n_ok = rn < CO
        mbarrier.wait(bars.index(STAGES), 0)
        for i in range(count):
            t = first + i * step
            acc = _pair_units(x_desc, x2_desc, a_s, w_s, bars, gl.zeros((BM, BN), gl.int32, layout=mma), i, 0, KT1,
                              KT1, KT, STAGES, first, step, tiles_w, tiles_hw, units)
            v = acc.to(gl.float32) * _col(scale, rn, n_ok)
            if HAS_BIAS:
                v += _col(bias, rn, n_ok)
            acc = _pair_units(x_desc, x2_desc, a_s, w_s, bars, gl.zeros((BM, BN), gl.int32, layout=mma), i, KT1,
                              KT2, KT1, KT, STAGES, first, step, tiles_w, tiles_hw, units)
            v2 = acc.to(gl.float32) * _col(scale2, rn, n_ok)
            if HAS_BIAS2:
                v2 += _col(bias2, rn, n_ok)
            q = wg.activate_requant(v + v2, out_inv, ACT)
            buf = c_s.index(i % 2)
            wg.store_tile(q, buf.reshape([BM, BN]), buf, y_desc,
                          [t // tiles_hw, (t % tiles_hw) // tiles_w * BH, (t % tiles_w) * BW, off_n])
        tma.store_wait(0)
        for i in gl.static_range(STAGES + 1):
            mbarrier.invalidate(bars.index(i))


def _block_ks(c: int, c2: int) -> list[int]:
    """The channel blocks both inputs divide into, widest first: 128, 64, 32 or 16."""
    return [bk for bk in (128, 64, 32, 16) if c % bk == 0 and c2 % bk == 0]


def smem_bytes(cfg: dict, c: int, c2: int) -> int:
    """One program's shared memory: both weight blocks, the STAGES input slots, two output tiles."""
    bm, bn, bk = cfg["BH"] * cfg["BW"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    return (c + c2) * bn + cfg["STAGES"] * bm * bk + 2 * bm * bn + BARRIER_BYTES


def configs(oh: int | None, ow: int | None, co: int, c: int, c2: int, smem: int) -> list[dict]:
    """Tiles whose weight blocks, slots and output tiles fit `smem` (as many programs to a multiprocessor as fit, up
    to four) and that do not dwarf the map or the channels, each with the widest channel block that fits (128-byte
    box rows: 64-byte ones, every other 64 bytes of a pixel, ran the layer-2 pair 30 % slower); four slots first,
    as the autotuner times the first eight; none unless the channels are multiples of 16."""
    if c % 16 or c2 % 16 or co % 16:
        return []
    out = []
    for stages in (4, 3):
        for bh, bw, bn, warps in _SPACE:
            if bn > max(64, co) or bw > max(8, triton.next_power_of_2(ow or 8)) or bh > max(
                    8, triton.next_power_of_2(oh or 8)):
                continue
            cfg = widest_block({"BH": bh, "BW": bw, "BLOCK_N": bn}, {"STAGES": stages, "num_warps": warps},
                               _block_ks(c, c2), lambda cfg: smem_bytes(cfg, c, c2), smem)
            if cfg:
                out.append(cfg)
    return out


def conv_pair(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, x2: torch.Tensor,
              w2: torch.Tensor, scale2: torch.Tensor, bias2: torch.Tensor | None, *, out_scale: float,
              activation: str = "none", config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """act((x ⊛ w)·scale + bias + (x2 ⊛ w2)·scale2 + bias2) requantized to int8 at out_scale: x [N, C, OH, OW] and
    x2 [N, C2, OH, OW] int8 NHWC memory TMA can address (strided views too), w [CO, C] and w2 [CO, C2] int8 (K
    contiguous), channels multiples of 16. NCHW-shaped, channels_last. ValueError for what it does not take."""
    if not available():
        raise ValueError("this triton has no Gluon")
    if activation not in wg.ACTIVATIONS or {t.dtype for t in (x, w, x2, w2)} != {torch.int8}:
        raise ValueError(f"int8 operands and one of the activations {wg.ACTIVATIONS} only")
    (n, c, oh, ow), co = x.shape, w.shape[0]
    if x2.shape[0] != n or tuple(x2.shape[2:]) != (oh, ow) or w2.shape != (co, x2.shape[1]) or w.shape[1] != c:
        raise ValueError("the two convs must share the output map: x [N, C, H, W], x2 [N, C2, H, W]")
    if not (tma_nhwc(x) and tma_nhwc(x2)) or c % 16 or x2.shape[1] % 16 or co % 16:
        raise ValueError("inputs must be NHWC memory TMA can address, with multiples of 16 channels")
    y = take(out, (n, co, oh, ow), torch.int8, x.device, torch.channels_last)
    if y.numel() == 0:
        return y
    if not y.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("the output buffer must be channels_last")
    bh, bw, bn, bk = config["BH"], config["BW"], config["BLOCK_N"], config["BLOCK_K"]
    if c % bk or x2.shape[1] % bk:
        raise ValueError("both inputs' channels must be multiples of BLOCK_K")
    box = [1, bh, bw, bk]
    tiles_w, tiles_hw = triton.cdiv(ow, bw), triton.cdiv(oh, bh) * triton.cdiv(ow, bw)
    tiles, tiles_n = n * tiles_hw, triton.cdiv(co, bn)
    per_n = max(1, min(tiles, config["stream"] * wg.multiprocessors(x.device) // tiles_n))
    _pair_kernel[(tiles_n * per_n,)](
        wg.desc(x.permute(0, 2, 3, 1), box), wg.desc(w, [bn, bk]), wg.desc(x2.permute(0, 2, 3, 1), box),
        wg.desc(w2, [bn, bk]),
        wg.desc(y.permute(0, 2, 3, 1), [1, bh, bw, bn]), scale, bias if bias is not None else scale, scale2,
        bias2 if bias2 is not None else scale2, co, inv_scale(out_scale), tiles_w, tiles_hw, tiles,
        HAS_BIAS=bias is not None, HAS_BIAS2=bias2 is not None, ACT=activation, KT1=c // bk, KT2=x2.shape[1] // bk,
        STAGES=config["STAGES"], num_warps=config["num_warps"], enable_fp_fusion=False, **pdl_args(x.device))
    return y
