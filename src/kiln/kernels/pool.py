"""2-D max pooling of any float, int8 or fp8 (e4m3) tensor in one pass: each program takes a block of output
pixels × a block of channels and keeps the running maximum over the window's taps in fp32 (exact for every input
type); taps in the padding read as -inf. Reads any strides, writes the input's memory format: on channels_last
(NHWC) memory each tap is one contiguous channel run per pixel.

Max pooling commutes with quantization (rounding and a positive scale are monotonic), so an int8 engine pools
its int8 activations directly, at a quarter of the fp32 bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.out_buffer import take

CONFIGS = [{"BLOCK_P": 64, "BLOCK_C": 64, "num_warps": 4}, {"BLOCK_P": 128, "BLOCK_C": 64, "num_warps": 8},
           {"BLOCK_P": 32, "BLOCK_C": 128, "num_warps": 4}, {"BLOCK_P": 256, "BLOCK_C": 32, "num_warps": 8}]


@triton.jit
def _max_pool_kernel(x, y, N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, s_xn, s_xc, s_xh, s_xw, s_yn, s_yc,
                     s_yh, s_yw, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    rp = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n, oh, ow = rp // (OH * OW), (rp // OW) % OH, rp % OW
    p_ok, c_ok = rp < N * OH * OW, rc < C
    acc = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    for tap in range(0, KH * KW):
        ih = oh * sh - ph + (tap // KW) * dh
        iw = ow * sw - pw + (tap % KW) * dw
        ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        mask = ok[:, None] & c_ok[None, :]
        v = tl.load(x + (n.to(tl.int64) * s_xn + ih * s_xh + iw * s_xw)[:, None] + rc[None, :] * s_xc, mask=mask)
        acc = tl.maximum(acc, tl.where(mask, v.to(tl.float32), float("-inf")))
    inside = p_ok[:, None] & c_ok[None, :]
    acc = tl.where(inside, acc, 0.0)  # lanes outside the output hold -inf, which has no int8 value
    tl.store(y + (n.to(tl.int64) * s_yn + oh * s_yh + ow * s_yw)[:, None] + rc[None, :] * s_yc,
             acc.to(y.dtype.element_ty), mask=inside)


def max_pool2d(x: torch.Tensor, kernel, strides, pads, dilations, out_hw: tuple[int, int], config: dict | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """MaxPool of x [N, C, H, W] with pads (top, left) and the output size `out_hw` (the caller applies ONNX's
    floor / ceil rule); in x's memory format, in `out`'s bytes when given."""
    cfg = config or CONFIGS[0]
    (n, c, h, w), (oh, ow) = x.shape, out_hw
    fmt = torch.channels_last if x.stride(1) == 1 and c > 1 else torch.contiguous_format
    y = take(out, (n, c, oh, ow), x.dtype, x.device, fmt)
    if y.numel():
        grid = (triton.cdiv(n * oh * ow, cfg["BLOCK_P"]), triton.cdiv(c, cfg["BLOCK_C"]))
        _max_pool_kernel[grid](x, y, n, c, h, w, oh, ow, *kernel, *strides, *pads, *dilations, *x.stride(),
                               *y.stride(), BLOCK_P=cfg["BLOCK_P"], BLOCK_C=cfg["BLOCK_C"],
                               num_warps=cfg["num_warps"])
    return y
