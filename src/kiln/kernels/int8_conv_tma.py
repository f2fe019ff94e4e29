"""Stride-1 int8 or fp8 (e4m3) convolution as an implicit GEMM whose input tiles arrive by 4-D TMA boxes (Hopper):
a program computes a BH × BW block of output pixels of one image for BLOCK_N channels; for each tap (r, s) and
channel block it loads the NHWC input box [1, BH, BW, BLOCK_K] at (n, oh0 + r·dh - ph, ow0 + s·dw - pw, c0) —
the box the tap reads, shifted — and TMA fills whatever lies outside the image (the padding) with zeros, so
no index arithmetic or masks run per element. The weight [CO, KH·KW·C] (K-major) comes by 2-D TMA boxes.
Epilogue and arithmetic are kernels/int8_gemm.py's (`epilogue`), so results equal kernels/int8_conv.py's.

Needs NHWC input memory (channels_last, or a strided view of it such as a strided 1x1 conv's subsample) with
C·itemsize a multiple of 16 bytes and KH·KW·C likewise; `conv2d` runs kernels/int8_conv.py instead when the input
is not so laid out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels import int8_conv
from kiln.kernels.common import TMA_ALIGN, TensorDescriptor, tma_nhwc
from kiln.kernels.int8_gemm import FP8_PROMOTE
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

CONFIG_KEYS = ("BH", "BW", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
# output blocks of 64-128 pixels (8x8 divides 56 and 28's 4x7 rows poorly least), 64-128 channels
_SPACE = [(8, 8, 64, 64, 4, 4), (8, 16, 64, 64, 4, 4), (16, 8, 64, 64, 4, 4), (8, 16, 128, 64, 8, 4),
          (8, 8, 128, 64, 4, 4), (8, 8, 128, 128, 8, 3), (16, 16, 64, 64, 8, 3), (4, 8, 64, 64, 4, 4),
          (8, 16, 64, 32, 4, 4), (16, 16, 64, 32, 8, 4), (8, 8, 64, 32, 4, 4)]  # BLOCK_K 32: ≤ 32 channels only


@triton.jit
def _conv_tma_kernel(x_desc, w_desc, scale, bias, res, y, OH, OW, CO, C, KW, ph, pw, dh, dw, out_inv, res_scale,
                     act_alpha, act_beta, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, NUM_K,
                     HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, RES_Q: tl.constexpr, REQUANT: tl.constexpr,
                     ACT: tl.constexpr, FP8: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tiles_w = tl.cdiv(OW, BW)
    tiles_hw = tl.cdiv(OH, BH) * tiles_w
    pid = tl.program_id(0)
    n = pid // tiles_hw
    oh0 = (pid % tiles_hw) // tiles_w * BH
    ow0 = (pid % tiles_w) * BW
    off_n = tl.program_id(1) * BLOCK_N
    c_blocks = tl.cdiv(C, BLOCK_K)
    if FP8:
        acc = tl.zeros((BH * BW, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BH * BW, BLOCK_N), dtype=tl.int32)
    for kb in range(0, NUM_K):
        tap = kb // c_blocks
        c0 = (kb % c_blocks) * BLOCK_K
        a = x_desc.load([n, oh0 + (tap // KW) * dh - ph, ow0 + (tap % KW) * dw - pw, c0])
        a = tl.reshape(a, (BH * BW, BLOCK_K))
        b = w_desc.load([off_n, tap * C + c0])
        if FP8:
            acc = tl.dot(a, b.T, acc, out_dtype=tl.float32, max_num_imprecise_acc=FP8_PROMOTE)
        else:
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
    i = tl.arange(0, BH * BW)
    oh, ow = oh0 + i // BW, ow0 + i % BW
    rn = off_n + tl.arange(0, BLOCK_N)
    int8_conv.store_pixels(acc, n, oh, ow, (oh < OH) & (ow < OW), rn, rn < CO, res, y, scale, bias, out_inv,
                           res_scale, act_alpha, act_beta, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS,
                           HAS_RES, RES_Q, REQUANT, ACT, FP8)


def addressable(c: int, taps: int, itemsize: int = 1) -> bool:
    """Whether TMA can address a conv with `c` input channels and `taps` kernel taps (16-byte strides)."""
    return (c * itemsize) % TMA_ALIGN == 0 and (taps * c * itemsize) % TMA_ALIGN == 0


def configs(oh: int | None, ow: int | None, co: int, c: int, smem: int) -> list[dict]:
    """Tiles that fit `smem` (num_stages input and weight tiles) and do not dwarf the output map or the
    channels; the first of the space always."""
    out = []
    for t in _SPACE:
        cfg = dict(zip(CONFIG_KEYS, t))
        need = cfg["num_stages"] * (cfg["BH"] * cfg["BW"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]
        fits = cfg["BH"] <= max(4, triton.next_power_of_2(oh or 8)) and cfg["BW"] <= max(
            8, triton.next_power_of_2(ow or 8)) and cfg["BLOCK_N"] <= max(64, triton.next_power_of_2(co)) and min(
            64, c) <= cfg["BLOCK_K"] <= max(32, triton.next_power_of_2(c))
        if need <= smem and (fits or t == _SPACE[0]):
            out.append(cfg)
    return out


def conv2d(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor, kernel: tuple[int, int], strides, pads,
           dilations, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *,
           out_scale: float | None = None, res_scale: float | None = None, activation: str = "none",
           act_alpha: float = 1.0, act_beta: float = 0.0, out_dtype: torch.dtype = torch.float32, config: dict,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/int8_conv.conv2d's result (same arguments; `w_packed` from its pack_weight) for stride-1 convs on an
    NHWC input TMA can address; other calls run kernels/int8_conv.py (its first tile)."""
    int8_conv.check_operands(x, w_packed, residual, res_scale, activation)
    (n, c, h, wd), (kh, kw), co = x.shape, kernel, w_packed.shape[1]
    w = w_packed.t()  # [CO, KH·KW·C], K contiguous
    if tuple(strides) != (1, 1) or not tma_nhwc(x) or not addressable(c, kh * kw) or not w.is_contiguous() or \
            w.data_ptr() % TMA_ALIGN:
        return int8_conv.conv2d(x, w_packed, scale, kernel, strides, pads, dilations, bias, residual,
                                out_scale=out_scale, res_scale=res_scale, activation=activation, act_alpha=act_alpha,
                                act_beta=act_beta, out_dtype=out_dtype, out=out)
    (dh, dw) = dilations
    oh = h + pads[0] + pads[2] - dh * (kh - 1)
    ow = wd + pads[1] + pads[3] - dw * (kw - 1)
    y = take(out, (n, co, oh, ow), x.dtype if out_scale is not None else out_dtype, x.device, torch.channels_last)
    if y.numel() == 0:
        return y
    bh, bw, bn, bk = config["BH"], config["BW"], config["BLOCK_N"], config["BLOCK_K"]
    nhwc = x.permute(0, 2, 3, 1)  # [N, H, W, C], C contiguous
    x_desc = TensorDescriptor(nhwc, list(nhwc.shape), list(nhwc.stride()), [1, bh, bw, bk])
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    r = residual if residual is not None else y
    grid = (n * triton.cdiv(oh, bh) * triton.cdiv(ow, bw), triton.cdiv(co, bn))
    _conv_tma_kernel[grid](x_desc, w_desc, scale, bias if bias is not None else scale, r, y, oh, ow, co, c, kw,
                           pads[0], pads[1], dh, dw, inv_scale(out_scale) if out_scale is not None else 1.0,
                           float(res_scale or 1.0), float(act_alpha), float(act_beta), *r.stride(), *y.stride(),
                           kh * kw * triton.cdiv(c, bk), HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                           RES_Q=res_scale is not None, REQUANT=out_scale is not None, ACT=activation,
                           FP8=x.dtype == torch.float8_e4m3fn, BH=bh, BW=bw, BLOCK_N=bn, BLOCK_K=bk,
                           num_warps=config["num_warps"], num_stages=config["num_stages"], enable_fp_fusion=False)
    return y
