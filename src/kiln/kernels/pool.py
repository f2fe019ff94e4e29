"""2-D max pooling of any float, int8 or fp8 (e4m3) tensor in one pass: each program takes a block of output
pixels × a block of channels and keeps the running maximum over the window's taps in fp32 (exact for every input
type). Without dilation a tap in the padding reads the nearest pixel of the same window instead (which leaves the
maximum as it is and needs no mask); with it, padding reads as -inf. Reads any strides, writes the input's memory
format: on channels_last (NHWC) memory each tap is one contiguous channel run per pixel.

Max pooling commutes with quantization (rounding and a positive scale are monotonic), so an int8 engine pools
its int8 activations directly, at a quarter of the fp32 bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import INTERPRET, pdl_args, pdl_start
from kiln.kernels.out_buffer import take

CONFIGS = [{"BLOCK_P": 64, "BLOCK_C": 64, "num_warps": 4}, {"BLOCK_P": 128, "BLOCK_C": 64, "num_warps": 8},
           {"BLOCK_P": 32, "BLOCK_C": 128, "num_warps": 4}, {"BLOCK_P": 256, "BLOCK_C": 32, "num_warps": 8},
           {"BLOCK_P": 128, "BLOCK_C": 64, "num_warps": 4}]


@triton.jit
def _max_pool_kernel(x, y, N, C, H, W, OH, OW, sh, sw, ph, pw, dh, dw, s_xn, s_xc, s_xh, s_xw, s_yn, s_yc, s_yh, s_yw,
                     KH: tl.constexpr, KW: tl.constexpr, CLAMP: tl.constexpr, BLOCK_P: tl.constexpr,
                     BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    rp = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n, oh, ow = rp // (OH * OW), (rp // OW) % OH, rp % OW
    p_ok, c_ok = rp < N * OH * OW, rc < C
    inside = p_ok[:, None] & c_ok[None, :]
    ih0, iw0 = oh * sh - ph, ow * sw - pw
    pixel = x + n.to(tl.int64)[:, None] * s_xn + rc[None, :] * s_xc
    acc = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    for r in tl.static_range(KH):  # unrolled: every tap's load in flight at once
        ih = ih0 + r * dh
        for s in tl.static_range(KW):
            iw = iw0 + s * dw
            if CLAMP:  # a tap in the padding reads the window's nearest pixel inside the map instead
                src = pixel + (tl.minimum(tl.maximum(ih, 0), H - 1) * s_xh +
                               tl.minimum(tl.maximum(iw, 0), W - 1) * s_xw)[:, None]
                acc = tl.maximum(acc, tl.load(src, mask=inside).to(tl.float32))
            else:
                ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                mask = ok[:, None] & inside
                v = tl.load(pixel + (ih * s_xh + iw * s_xw)[:, None], mask=mask)
                acc = tl.maximum(acc, tl.where(mask, v.to(tl.float32), float("-inf")))
    acc = tl.where(inside, acc, 0.0)  # lanes outside the output hold -inf, which has no int8 value
    tl.store(y + (n.to(tl.int64) * s_yn + oh * s_yh + ow * s_yw)[:, None] + rc[None, :] * s_yc,
             acc.to(y.dtype.element_ty), mask=inside)


_LANES_MIN = tl.constexpr(-8323200)  # 0xFF80FF80: two 16-bit lanes of -128
# four int8 channels of a word into two words of sign-extended 16-bit lanes (channels 0, 2 and 1, 3), each lane's
# running maximum by max.s16x2 (Hopper's packed 16-bit max): one instruction per two values and tap
_MAX_LANES = tl.constexpr("""{
.reg .b32 e, o;
prmt.b32 e, $4, 0, 0xA280;
prmt.b32 o, $4, 0, 0xB391;
max.s16x2 $0, $2, e;
max.s16x2 $1, $3, o;
}""")


@triton.jit
def _max_pool_words_kernel(x, y, N, C4, H, W, OH, OW, sh, sw, ph, pw, s_xn, s_xh, s_xw, s_yn, s_yh, s_yw,
                           KH: tl.constexpr, KW: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                           PDL: tl.constexpr):
    """int8 NHWC MaxPool (no dilation, every window meeting the map) on words of four channels: strides in int32
    words; lanes as _MAX_LANES, packed back to bytes at the end."""
    pdl_start(PDL)
    rp = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    rc = tl.program_id(1) * (BLOCK_C // 4) + tl.arange(0, BLOCK_C // 4)
    n, oh, ow = rp // (OH * OW), (rp // OW) % OH, rp % OW
    inside = (rp < N * OH * OW)[:, None] & (rc < C4)[None, :]
    ih0, iw0 = oh * sh - ph, ow * sw - pw
    pixel = x.to(tl.pointer_type(tl.int32)) + n.to(tl.int64)[:, None] * s_xn + rc[None, :]
    lo = tl.full((BLOCK_P, BLOCK_C // 4), _LANES_MIN, tl.int32)
    hi = tl.full((BLOCK_P, BLOCK_C // 4), _LANES_MIN, tl.int32)
    for r in tl.static_range(KH):
        for s in tl.static_range(KW):
            src = pixel + (tl.minimum(tl.maximum(ih0 + r, 0), H - 1) * s_xh +
                           tl.minimum(tl.maximum(iw0 + s, 0), W - 1) * s_xw)[:, None]
            word = tl.load(src, mask=inside, other=0)
            lo, hi = tl.inline_asm_elementwise(_MAX_LANES, "=r,=r,r,r,r", [lo, hi, word],
                                               dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    out = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x6240;", "=r,r,r", [lo, hi], dtype=tl.int32,
                                    is_pure=True, pack=1)
    tl.store(y.to(tl.pointer_type(tl.int32)) + (n.to(tl.int64) * s_yn + oh * s_yh + ow * s_yw)[:, None] + rc[None, :],
             out, mask=inside)


def _words(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether x and y are int8 NHWC memory of whole, aligned four-channel words (the packed kernel's input)."""
    return (not INTERPRET and x.is_cuda and x.dtype == torch.int8 and x.shape[1] % 4 == 0 and
            all(t.stride(1) == 1 and t.data_ptr() % 4 == 0 and all(st % 4 == 0 for st in (t.stride(0), t.stride(2),
                                                                                          t.stride(3)))
                for t in (x, y)))


def _windows_meet_the_map(kernel, strides, pads, dilations, hw, out_hw) -> bool:
    """Whether every window is a run of KH x KW pixels that overlaps the map (no dilation, the first window reaching
    row / column 0, the last starting inside): then a padding tap may read the window's nearest pixel."""
    return tuple(dilations) == (1, 1) and all(p < k and (o - 1) * s - p <= n - 1 for k, s, p, n, o in zip(
        kernel, strides, pads, hw, out_hw))


def max_pool2d(x: torch.Tensor, kernel, strides, pads, dilations, out_hw: tuple[int, int], config: dict | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """MaxPool of x [N, C, H, W] with pads (top, left) and the output size `out_hw` (the caller applies ONNX's
    floor / ceil rule); in x's memory format, in `out`'s bytes when given."""
    cfg = config or CONFIGS[0]
    (n, c, h, w), (oh, ow) = x.shape, out_hw
    fmt = torch.channels_last if x.stride(1) == 1 and c > 1 else torch.contiguous_format
    y = take(out, (n, c, oh, ow), x.dtype, x.device, fmt)
    if not y.numel():
        return y
    grid = (triton.cdiv(n * oh * ow, cfg["BLOCK_P"]), triton.cdiv(c, cfg["BLOCK_C"]))
    clamp = _windows_meet_the_map(kernel, strides, pads, dilations, (h, w), out_hw)
    if clamp and _words(x, y):
        words = [st // 4 for t in (x, y) for st in (t.stride(0), t.stride(2), t.stride(3))]
        _max_pool_words_kernel[grid](x, y, n, c // 4, h, w, oh, ow, *strides,
                                     *pads, *words, KH=kernel[0], KW=kernel[1], BLOCK_P=cfg["BLOCK_P"],
                                     BLOCK_C=cfg["BLOCK_C"], num_warps=cfg["num_warps"], **pdl_args(x.device))
        return y
    _max_pool_kernel[grid](x, y, n, c, h, w, oh, ow, *strides, *pads, *dilations, *x.stride(), *y.stride(),
                           KH=kernel[0], KW=kernel[1], CLAMP=clamp, BLOCK_P=cfg["BLOCK_P"], BLOCK_C=cfg["BLOCK_C"],
                           num_warps=cfg["num_warps"], **pdl_args(x.device))
    return y


# Timed on the layout each was made for (the autotuner's "layout" mark); a map of the other layout takes that
# layout's first config. NCHW: blocks of BLOCK_HW pixels x BLOCK_C channels of one image; channels_last: BLOCK_C
# channels of one image, UNROLL pixels' loads in flight per step, no cross-thread sums.
NCHW_CONFIGS = [{"BLOCK_HW": 16, "BLOCK_C": 256, "num_warps": 4}, {"BLOCK_HW": 32, "BLOCK_C": 128, "num_warps": 4}]
NHWC_CONFIGS = [{"UNROLL": 8, "BLOCK_C": 256, "num_warps": 1}, {"UNROLL": 8, "BLOCK_C": 512, "num_warps": 2},
                {"UNROLL": 4, "BLOCK_C": 1024, "num_warps": 4}, {"UNROLL": 16, "BLOCK_C": 128, "num_warps": 1}]
GLOBAL_CONFIGS = [{"layout": "nhwc", **c} for c in NHWC_CONFIGS] + [{"layout": "nchw", **c} for c in NCHW_CONFIGS]


@triton.jit
def _global_pool_kernel(x, y, C, HW, s_xn, s_xc, s_xp, inv_hw, MAX: tl.constexpr, BLOCK_HW: tl.constexpr,
                        BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    """Any layout: each program one image x a block of channels, summing BLOCK_HW x BLOCK_C tiles across threads."""
    pdl_start(PDL)
    n = tl.program_id(0)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = rc < C
    acc = tl.full((BLOCK_C,), float("-inf") if MAX else 0.0, tl.float32)
    base = x + n.to(tl.int64) * s_xn
    for p0 in range(0, HW, BLOCK_HW):
        rp = p0 + tl.arange(0, BLOCK_HW)
        mask = (rp < HW)[:, None] & c_ok[None, :]
        v = tl.load(base + rp[:, None] * s_xp + rc[None, :] * s_xc, mask=mask, other=float("-inf") if MAX else 0.0)
        if MAX:
            acc = tl.maximum(acc, tl.max(v.to(tl.float32), 0))
        else:
            acc += tl.sum(v.to(tl.float32), 0)
    if not MAX:
        acc = acc * inv_hw
    tl.store(y + n.to(tl.int64) * C + rc, acc.to(y.dtype.element_ty), mask=c_ok)


@triton.jit
def _global_pool_rows_kernel(x, y, C, HW, s_xn, s_xc, s_xp, inv_hw, MAX: tl.constexpr, UNROLL: tl.constexpr,
                             BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    """Channels-last maps: each program one image x a run of channels, each thread summing its own channels over
    the pixels (UNROLL loads in flight at a time)."""
    pdl_start(PDL)
    n = tl.program_id(0)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = rc < C
    acc = tl.full((BLOCK_C,), float("-inf") if MAX else 0.0, tl.float32)
    base = x + n.to(tl.int64) * s_xn + rc * s_xc
    for p0 in range(0, HW, UNROLL):
        for i in tl.static_range(UNROLL):
            v = tl.load(base + (p0 + i) * s_xp, mask=c_ok & (p0 + i < HW), other=float("-inf") if MAX else 0.0)
            if MAX:
                acc = tl.maximum(acc, v.to(tl.float32))
            else:
                acc += v.to(tl.float32)
    if not MAX:
        acc = acc * inv_hw
    tl.store(y + n.to(tl.int64) * C + rc, acc.to(y.dtype.element_ty), mask=c_ok)


def global_pool2d(x: torch.Tensor, op: str, config: dict | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """GlobalAveragePool (op "avg", summed in fp32) or GlobalMaxPool ("max") of a float x [N, C, H, W] whose H and W
    flatten into one stride (NCHW or channels_last): [N, C, 1, 1]."""
    n, c, h, w = x.shape
    if h > 1 and x.stride(2) != w * x.stride(3):
        raise ValueError("H and W must flatten into one stride (NCHW or channels_last)")
    y = take(out, (n, c, 1, 1), x.dtype, x.device)
    if not y.numel():
        return y
    rows = x.stride(1) == 1 and c > 1  # channels_last
    cfg = config if config and ("UNROLL" in config) == rows else (NHWC_CONFIGS if rows else NCHW_CONFIGS)[0]
    kernel, block = (_global_pool_rows_kernel, dict(UNROLL=cfg["UNROLL"])) if rows else \
        (_global_pool_kernel, dict(BLOCK_HW=cfg["BLOCK_HW"]))
    kernel[(n, triton.cdiv(c, cfg["BLOCK_C"]))](x, y, c, h * w, x.stride(0), x.stride(1), x.stride(3),
                                                1.0 / max(h * w, 1), MAX=op == "max", BLOCK_C=cfg["BLOCK_C"],
                                                num_warps=cfg["num_warps"], **block, **pdl_args(x.device))
    return y
