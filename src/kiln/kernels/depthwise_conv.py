"""Depthwise 2-D convolution (one filter per channel: group = C = CO) with bias, residual and activation fused:
Y = act(X ⊛ W + bias + residual), fp32 accumulation, NHWC output.

A depthwise conv has no reduction over channels, so it runs on CUDA cores, not tensor cores: each program takes a
tile of output pixels × channels and adds KH·KW shifted input tiles, each read across contiguous channels of a
channels_last input. It is bound by its bytes (MobileNetV2's layers: cuDNN took 2-3.5× their memory time). The
pixels are a run of the flattened output (TILE_W 0) or a 2-D patch BLOCK_P / TILE_W rows by TILE_W columns, whose
taps overlap more (faster for stride-2 layers on an H200, not for stride-1 ones).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import ACTIVATIONS, conv_epilogue, conv_output, output_pixels, pow2, tile_configs

CONFIG_KEYS = ("BLOCK_P", "BLOCK_C", "num_warps", "TILE_W")
# best-first on an H200 (MobileNetV2 b64, gpu_cuda_core_conv_probe, 2026-11-29): flat runs win the stride-1 layers,
# 2-D patches the stride-2 ones (68.4 against 74.5 µs at 96 channels @ 112², 36.6 against 41.5 at 144 @ 56²)
_SPACE = [(64, 32, 4, 0), (128, 32, 4, 0), (64, 64, 4, 0), (32, 64, 4, 0), (64, 32, 4, 8), (128, 32, 4, 16),
          (16, 128, 4, 0), (32, 128, 8, 0), (128, 64, 8, 0), (8, 256, 4, 0), (64, 64, 4, 8), (64, 32, 4, 16),
          (32, 64, 4, 8), (256, 32, 8, 16), (128, 64, 8, 16), (16, 128, 4, 4)]
PER_LEVEL = {0: 1, 1: 2, 2: 4, 3: 6}  # configs offered per opt level; all from level 4


@triton.jit
def _depthwise_kernel(x, w, bias, res, y, N, H, W, C, OH, OW, sh, sw, ph, pw, dh, dw, act_alpha, act_beta,
                      s_xn, s_xc, s_xh, s_xw, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                      KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                      ACT: tl.constexpr, EVEN_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                      TILE_W: tl.constexpr):
    if TILE_W == 0:
        n, oh, ow, p_ok = output_pixels(N, OH, OW, BLOCK_P)
    else:  # program (n, patch row, patch column); a pixel's row and column by shifts of constant widths
        tiles_w = tl.cdiv(OW, TILE_W)
        tiles = tl.cdiv(OH, BLOCK_P // TILE_W) * tiles_w
        pid = tl.program_id(0)
        n = pid // tiles
        p = tl.arange(0, BLOCK_P)
        oh = (pid % tiles) // tiles_w * (BLOCK_P // TILE_W) + p // TILE_W
        ow = pid % tiles_w * TILE_W + p % TILE_W
        p_ok = (oh < OH) & (ow < OW)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    # EVEN_C: no channel mask, so a mask constant along the channels lets a row's channels load as vectors
    c_ok = (rc >= 0) if EVEN_C else (rc < C)
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * sh - ph + kh * dh
        for kw in tl.static_range(KW):
            iw = ow * sw - pw + kw * dw
            ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.load(x + (n * s_xn + ih * s_xh + iw * s_xw)[:, None] + rc[None, :] * s_xc,
                        mask=ok[:, None] if EVEN_C else ok[:, None] & c_ok[None, :], other=0.0)
            b = tl.load(w + (kh * KW + kw) * C + rc, mask=c_ok, other=0.0)
            acc += a.to(tl.float32) * b.to(tl.float32)[None, :]
    inside = p_ok[:, None] if EVEN_C else p_ok[:, None] & c_ok[None, :]
    conv_epilogue(acc, bias, res, y, n, oh, ow, rc, c_ok, inside, act_alpha, act_beta,
                  s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS, HAS_RES, ACT)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """[C, 1, KH, KW] → [KH·KW, C]: each tap's filters across the channels, read contiguously."""
    return w.reshape(w.shape[0], -1).t().contiguous()


def configs(pixels: int | None, c: int, level: int, ow: int | None = None) -> list[dict]:
    """Tiles no larger than the problem (output pixels, channels, output width), best-first; fewer at low
    levels."""
    return tile_configs(_SPACE, CONFIG_KEYS, {"BLOCK_C": pow2(c, 8, 256), "BLOCK_P": pow2(pixels or 128, 8, 256),
                                              "TILE_W": pow2(ow or 16, 4, 16)},
                        {"BLOCK_P": 16, "BLOCK_C": pow2(c, 8, 64), "num_warps": 2, "TILE_W": 0}, PER_LEVEL, level)


def depthwise_conv2d(x: torch.Tensor, w_packed: torch.Tensor, kernel: tuple[int, int], strides, pads, dilations,
                     bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *,
                     activation: str = "none", act_alpha: float = 1.0, act_beta: float = 0.0,
                     config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """act(depthwise conv2d(x, w) + bias + residual) as an NCHW-shaped, channels_last tensor in x's dtype (in
    `out`'s bytes when given). x [N, C, H, W] (any strides); w_packed from `pack_weight`; pads [top, left, bottom,
    right]."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    (n, c, h, wd), (kh, kw) = x.shape, kernel
    (sh, sw), (dh, dw) = strides, dilations
    y = conv_output(x, c, kernel, strides, pads, dilations, out)
    oh, ow = y.shape[2:]
    if y.numel() == 0:
        return y
    cfg = config or configs(n * oh * ow, c, 1, ow)[0]
    r = residual if residual is not None else y
    tile_w = cfg.get("TILE_W", 0)
    pixel_tiles = (n * triton.cdiv(oh, cfg["BLOCK_P"] // tile_w) * triton.cdiv(ow, tile_w) if tile_w
                   else triton.cdiv(n * oh * ow, cfg["BLOCK_P"]))
    grid = (pixel_tiles, triton.cdiv(c, cfg["BLOCK_C"]))
    _depthwise_kernel[grid](x, w_packed, bias if bias is not None else y, r, y, n, h, wd, c, oh, ow, sh, sw,
                            pads[0], pads[1], dh, dw, float(act_alpha), float(act_beta),
                            *x.stride(), *r.stride(), *y.stride(), KH=kh, KW=kw,
                            HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation,
                            EVEN_C=c % cfg["BLOCK_C"] == 0, BLOCK_P=cfg["BLOCK_P"], BLOCK_C=cfg["BLOCK_C"],
                            TILE_W=tile_w, num_warps=cfg["num_warps"])
    return y
