"""Two 1x1 int8 convs of one output map summed under one epilogue (kinds/quantized.QuantConvPair: a bottleneck's
last conv and its downsample), in Gluon for Hopper: per output tile (BH x BW pixels, BLOCK_N channels) the
reduction over the first input's channels, then over the second's, through one pipeline of 4-D TMA boxes and
wgmma (one in flight); then v = (fp32(acc)·scale + bias) + (fp32(acc2)·scale2 + bias2), the activation,
int8 out by a TMA store. Either input may be a strided view (a strided conv's subsample, see kernels/common.tma_nhwc).
"""

from __future__ import annotations

import torch
import triton

from kiln.kernels import int8_gemm_wgmma as wg
from kiln.kernels.common import tma_nhwc
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

CONFIG_KEYS = wg.CONV_KEYS
REGISTERS = 64  # fp32 values per thread of one [BM, BLOCK_N] tile: two such tiles (v and acc2) stay live


def available() -> bool:
    return wg.available()


if wg.gluon is not None:
    gluon, gl = wg.gluon, wg.gl
    mbarrier, tma = wg.mbarrier, wg.tma

    @gluon.jit
    def _pair_issue(x_desc, w_desc, x2_desc, w2_desc, step, K1, n, oh0, ow0, off_n, bar, a_dst, w_dst,
                    nbytes: gl.constexpr, pred):
        """Step `step`'s input box and weight tile: channel block `step` of the first conv, or `step - K1` of the
        second."""
        BK: gl.constexpr = x_desc.block_type.shape[3]
        first = step < K1
        second = step >= K1
        mbarrier.expect(bar, nbytes, pred=pred)
        wg._tma_load(x_desc, [n, oh0, ow0, step * BK], bar, a_dst, pred=pred & first)
        wg._tma_load(w_desc, [off_n, step * BK], bar, w_dst, pred=pred & first)
        wg._tma_load(x2_desc, [n, oh0, ow0, (step - K1) * BK], bar, a_dst, pred=pred & second)
        wg._tma_load(w2_desc, [off_n, (step - K1) * BK], bar, w_dst, pred=pred & second)

    @gluon.jit
    def _col(ptr, rn, n_ok):
        return gl.expand_dims(gl.load(ptr + rn, mask=n_ok, other=0.0), 0)

    @gluon.jit
    def _pair_kernel(x_desc, w_desc, x2_desc, w2_desc, y_desc, scale, bias, scale2, bias2, OH, OW, CO, K1, K2,
                     out_inv, HAS_BIAS: gl.constexpr, HAS_BIAS2: gl.constexpr, ACT: gl.constexpr,
                     STAGES: gl.constexpr):
        BH: gl.constexpr = x_desc.block_type.shape[1]
        BW: gl.constexpr = x_desc.block_type.shape[2]
        BK: gl.constexpr = x_desc.block_type.shape[3]
        BN: gl.constexpr = w_desc.block_type.shape[0]
        BM: gl.constexpr = BH * BW
        tiles_w = gl.cdiv(OW, BW)
        tiles_hw = gl.cdiv(OH, BH) * tiles_w
        pid = gl.program_id(0)
        n = pid // tiles_hw
        oh0 = (pid % tiles_hw) // tiles_w * BH
        ow0 = (pid % tiles_w) * BW
        off_n = gl.program_id(1) * BN

        a_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES, 1, BH, BW, BK], x_desc.layout)
        w_s = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, BK], w_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        nbytes: gl.constexpr = (BM + BN) * BK
        steps = K1 + K2
        for i in gl.static_range(STAGES - 1):
            _pair_issue(x_desc, w_desc, x2_desc, w2_desc, i, K1, n, oh0, ow0, off_n, ready.index(i), a_s.index(i),
                        w_s.index(i), nbytes, i < steps)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BN, 32])
        rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        n_ok = rn < CO
        acc = gl.zeros((BM, BN), gl.int32, layout=mma)
        for kb in range(K1):
            s = kb % STAGES
            acc = wg._mma_step(a_s.index(s).reshape([BM, BK]), w_s.index(s), acc, ready.index(s), (kb // STAGES) & 1)
            nk = kb + STAGES - 1
            _pair_issue(x_desc, w_desc, x2_desc, w2_desc, nk, K1, n, oh0, ow0, off_n, ready.index(nk % STAGES),
                        a_s.index(nk % STAGES), w_s.index(nk % STAGES), nbytes, nk < steps)
        acc = wg.warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        v = acc.to(gl.float32) * _col(scale, rn, n_ok)
        if HAS_BIAS:
            v += _col(bias, rn, n_ok)
        acc = gl.zeros((BM, BN), gl.int32, layout=mma)
        for kb in range(K1, steps):
            s = kb % STAGES
            acc = wg._mma_step(a_s.index(s).reshape([BM, BK]), w_s.index(s), acc, ready.index(s), (kb // STAGES) & 1)
            nk = kb + STAGES - 1
            _pair_issue(x_desc, w_desc, x2_desc, w2_desc, nk, K1, n, oh0, ow0, off_n, ready.index(nk % STAGES),
                        a_s.index(nk % STAGES), w_s.index(nk % STAGES), nbytes, nk < steps)
        acc = wg.warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
        v2 = acc.to(gl.float32) * _col(scale2, rn, n_ok)
        if HAS_BIAS2:
            v2 += _col(bias2, rn, n_ok)
        q = wg._activate_requant(v + v2, out_inv, ACT)
        c_s = gl.allocate_shared_memory(y_desc.dtype, [1, BH, BW, BN], y_desc.layout)
        c_s.reshape([BM, BN]).store(q)
        wg.fence_async_shared()
        wg._tma_store(y_desc, [n, oh0, ow0, off_n], c_s)
        tma.store_wait(0)


def configs(oh: int | None, ow: int | None, co: int, c: int, smem: int) -> list[dict]:
    """The implicit-GEMM conv's tiles (kernels/int8_gemm_wgmma.conv_configs) whose two live [BM, BLOCK_N] fp32 tiles
    fit the registers, with room for the output tile in shared memory."""
    out = []
    for cfg in wg.conv_configs(oh, ow, co, c, smem):
        bm = cfg["BH"] * cfg["BW"]
        need = cfg["STAGES"] * (bm + cfg["BLOCK_N"]) * cfg["BLOCK_K"] + bm * cfg["BLOCK_N"]
        if bm * cfg["BLOCK_N"] <= REGISTERS * 32 * cfg["num_warps"] and need <= smem:
            out.append(cfg)
    return out


def _desc(t: torch.Tensor, block: list[int]):
    return wg.TensorDescriptor(t, list(t.shape), list(t.stride()), block,
                               wg.gl.NVMMASharedLayout.get_default_for(block, wg.gl.int8))


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
    box = [1, bh, bw, bk]
    grid = (n * triton.cdiv(oh, bh) * triton.cdiv(ow, bw), triton.cdiv(co, bn))
    _pair_kernel[grid](_desc(x.permute(0, 2, 3, 1), box), _desc(w, [bn, bk]), _desc(x2.permute(0, 2, 3, 1), box),
                       _desc(w2, [bn, bk]), _desc(y.permute(0, 2, 3, 1), [1, bh, bw, bn]), scale,
                       bias if bias is not None else scale, scale2, bias2 if bias2 is not None else scale2, oh, ow, co,
                       triton.cdiv(c, bk), triton.cdiv(x2.shape[1], bk), inv_scale(out_scale),
                       HAS_BIAS=bias is not None, HAS_BIAS2=bias2 is not None, ACT=activation,
                       STAGES=config["STAGES"], num_warps=config["num_warps"], enable_fp_fusion=False)
    return y
