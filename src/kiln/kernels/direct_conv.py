"""Direct 2-D convolution on CUDA cores for few input channels and small kernels (a CNN's 3x3 stem on 3 colour
channels), with bias, residual and activation fused: Y = act(X ⊛ W + bias + residual), fp32 accumulation, NHWC output.

With C = 3 an implicit GEMM pads each tap's 3 channels to a tensor-core K of 16; here each (kh, kw, c) tap is one
outer product of a column of input pixels and a row of output-channel weights. MobileNetV2's 3→32 3x3/2 stem at
batch 64 writes 51 MB; cuDNN took 107 µs for it on an H200, five times those bytes' time, and the outer products 78 µs
(693 M fp32 FMAs). In fp16 / bf16 a DOT config instead gathers all C·KH·KW taps of a tile's pixels into one
[BLOCK_P, BLOCK_K] tile (K padded once, not per tap) and reduces it with a single tensor-core dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import (ACTIVATIONS, FEW_ROWS, MAP_ARGS, conv_epilogue, conv_output, interleave, output_pixels,
                                 pdl_args, pdl_start, pow2, tile_configs)

MAX_TAPS = 36  # C·KH·KW a direct conv takes: each tap is unrolled (ResNet-50's 147-tap 7x7 stem compiled for
# tens of seconds and needs tensor cores anyway)
CONFIG_KEYS = ("BLOCK_P", "BLOCK_N", "num_warps", "DOT")
_SPACE = [(128, 32, 4, 0), (64, 64, 4, 0), (256, 32, 8, 0), (128, 64, 8, 0), (64, 32, 4, 0), (32, 128, 4, 0)]
# the tensor-core gather (fp16 / bf16 only), interleaved with the outer products when offered
_DOT = [(128, 32, 4, 1), (64, 32, 4, 1), (128, 64, 4, 1), (256, 32, 8, 1)]
PER_LEVEL = {0: 1, 1: 2, 2: 3, 3: 4}  # configs offered per opt level; all from level 4


@triton.jit(do_not_specialize=MAP_ARGS)
def _direct_kernel(x, w, bias, res, y, N, H, W, OH, OW, CO, sh, sw, ph, pw, dh, dw, act_alpha, act_beta,
                   s_xn, s_xc, s_xh, s_xw, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                   C: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr,
                   HAS_RES: tl.constexpr, ACT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    n, oh, ow, p_ok = output_pixels(N, OH, OW, BLOCK_P)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < CO
    if DOT:  # tap k = (kh·KW + kw)·C + c, the packed weight's row order
        rk = tl.arange(0, BLOCK_K)
        kh, kw, c = rk // (KW * C), (rk // C) % KW, rk % C
        ih = oh[:, None] * sh - ph + kh[None, :] * dh
        iw = ow[:, None] * sw - pw + kw[None, :] * dw
        ok = p_ok[:, None] & (rk < C * KH * KW)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(x + (n * s_xn)[:, None] + c[None, :] * s_xc + ih * s_xh + iw * s_xw, mask=ok, other=0.0)
        b = tl.load(w + rk[:, None] * CO + rn[None, :], mask=(rk < C * KH * KW)[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b.to(a.dtype))
    else:
        acc = _outer_products(x, w, n, oh, ow, p_ok, rn, n_ok, H, W, CO, sh, sw, ph, pw, dh, dw, s_xn, s_xc, s_xh,
                              s_xw, C, KH, KW, BLOCK_P, BLOCK_N)
    conv_epilogue(acc, bias, res, y, n, oh, ow, rn, n_ok, p_ok[:, None] & n_ok[None, :], act_alpha, act_beta,
                  s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS, HAS_RES, ACT)


@triton.jit
def _outer_products(x, w, n, oh, ow, p_ok, rn, n_ok, H, W, CO, sh, sw, ph, pw, dh, dw, s_xn, s_xc, s_xh, s_xw,
                    C: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, BLOCK_P: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    """The conv's fp32 tile as one outer product per (kh, kw, c) tap on CUDA cores."""
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * sh - ph + kh * dh
        for kw in tl.static_range(KW):
            iw = ow * sw - pw + kw * dw
            ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            pixel = x + n * s_xn + ih * s_xh + iw * s_xw
            for c in tl.static_range(C):
                a = tl.load(pixel + c * s_xc, mask=ok, other=0.0).to(tl.float32)
                b = tl.load(w + ((kh * KW + kw) * C + c) * CO + rn, mask=n_ok, other=0.0).to(tl.float32)
                acc += a[:, None] * b[None, :]
    return acc


def configs(pixels: int | None, co: int, level: int, dot: bool = False) -> list[dict]:
    """Tiles no larger than the problem (output pixels, output channels), best-first; fewer at low levels. `dot`
    (2-byte inputs): the tensor-core gathers too, first; below opt level 4 only they, half as many, on FEW_ROWS or
    more output pixels (MobileNetV2's stem at batch 64: 25.5 µs against 66.3 for the best outer product, H200)."""
    limits = {"BLOCK_N": pow2(co, 16, 128), "BLOCK_P": pow2(pixels or 256, 16, 256)}
    fallback = dict(zip(CONFIG_KEYS, (16, pow2(co, 16, 64), 2, 0)))
    out = tile_configs(_SPACE, CONFIG_KEYS, limits, fallback, PER_LEVEL, 4)
    keep = PER_LEVEL.get(level, len(out) + len(_DOT))
    if dot:
        dots = [cfg for cfg in tile_configs(_DOT, CONFIG_KEYS, limits, {}, PER_LEVEL, 4) if cfg]
        if dots and pixels is not None and pixels >= FEW_ROWS and level in PER_LEVEL:
            return dots[:max(1, keep // 2)]
        out = interleave(dots, out)
    return out[:keep]


def direct_conv2d(x: torch.Tensor, w_packed: torch.Tensor, kernel: tuple[int, int], strides, pads, dilations,
                  bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, activation: str = "none",
                  act_alpha: float = 1.0, act_beta: float = 0.0, config: dict | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """act(conv2d(x, w) + bias + residual) as an NCHW-shaped, channels_last tensor in x's dtype (in `out`'s bytes
    when given). x [N, C, H, W] (any strides, C·KH·KW ≤ MAX_TAPS); w_packed from `conv.pack_weight`
    ([KH·KW·C, CO]); pads [top, left, bottom, right]."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    (n, c, h, wd), (kh, kw), co = x.shape, kernel, w_packed.shape[1]
    if c * kh * kw > MAX_TAPS:
        raise ValueError(f"a direct conv takes at most {MAX_TAPS} taps (C·KH·KW), not {c * kh * kw}")
    (sh, sw), (dh, dw) = strides, dilations
    y = conv_output(x, co, kernel, strides, pads, dilations, out)
    oh, ow = y.shape[2:]
    if y.numel() == 0:
        return y
    cfg = config or configs(n * oh * ow, co, 1)[0]
    dot = cfg.get("DOT", 0)
    if dot and x.element_size() != 2:
        raise ValueError("DOT tiles take fp16 / bf16 inputs (a tensor-core dot)")
    r = residual if residual is not None else y
    grid = (triton.cdiv(n * oh * ow, cfg["BLOCK_P"]), triton.cdiv(co, cfg["BLOCK_N"]))
    _direct_kernel[grid](x, w_packed, bias if bias is not None else y, r, y, n, h, wd, oh, ow, co, sh, sw,
                         pads[0], pads[1], dh, dw, float(act_alpha), float(act_beta),
                         *x.stride(), *r.stride(), *y.stride(), C=c, KH=kh, KW=kw,
                         HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation,
                         BLOCK_P=cfg["BLOCK_P"], BLOCK_N=cfg["BLOCK_N"], DOT=dot, BLOCK_K=pow2(c * kh * kw, 16, 64),
                         num_warps=cfg["num_warps"], **pdl_args(x.device))
    return y
