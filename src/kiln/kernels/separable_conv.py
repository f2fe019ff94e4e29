"""A depthwise conv and the 1x1 conv that reads it as one kernel (kinds/fused.SeparableConv):
Y = act2(act1(X ⊛ Wd + Bd) · Wp + Bp + R), NHWC output.

Each program takes a tile of output pixels × BLOCK_N output channels and walks the depthwise channels BLOCK_K at a
time: their depthwise values on CUDA cores (KH·KW shifted loads of a channels_last input, as kernels/depthwise_conv),
activated and rounded to the input's dtype as the unfused pair stores its map, then one tensor-core dot with the
1x1 weights. The depthwise map is never written, and the pair is one launch instead of two: at batch 1, where each
of MobileNetV2's layers is a few microseconds of launch and ramp, that is the saving (passes/fuse_separable_conv).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import (ACTIVATIONS, MAP_ARGS, SplitScratch, activate, conv_epilogue, conv_output,
                                 dot_precision, output_pixels, pdl_args, pdl_start, pow2, split_k_plan, split_k_sum,
                                 tile_configs, upcast_dot)

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps")
# best-first for latency-bound maps (batch 1): small pixel tiles make more programs; where they still fill under
# half the GPU, the channel blocks split across programs too (SPLIT_K): a program's channel blocks run one after
# another, each a round of dependent loads (stop 54, H200, batch 1: 960 channels unsplit took 16 µs)
_SPACE = [(16, 32, 64, 4), (32, 32, 32, 4), (16, 64, 64, 4), (64, 32, 32, 4), (32, 16, 32, 2), (64, 16, 32, 4),
          (32, 64, 64, 4), (16, 16, 64, 2), (16, 128, 64, 4), (64, 64, 32, 8), (128, 32, 32, 8), (128, 16, 32, 4),
          (32, 128, 32, 8), (16, 16, 32, 2)]
PER_LEVEL = {0: 1, 1: 2, 2: 4, 3: 6}  # configs offered per opt level; all from level 4


@triton.jit(do_not_specialize=MAP_ARGS)
def _separable_kernel(x, wd, bd, wp, bp, res, y, N, H, W, C, CO, OH, OW, sh, sw, ph, pw, dh, dw,
                      alpha1, beta1, alpha2, beta2, s_xn, s_xc, s_xh, s_xw, s_rn, s_rc, s_rh, s_rw,
                      s_yn, s_yc, s_yh, s_yw, ws, counts, t_per, KH: tl.constexpr, KW: tl.constexpr, HAS_BD: tl.constexpr,
                      HAS_BP: tl.constexpr, HAS_RES: tl.constexpr, ACT1: tl.constexpr, ACT2: tl.constexpr,
                      PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    n, oh, ow, p_ok = output_pixels(N, OH, OW, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < CO
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    steps = tl.cdiv(C, BLOCK_K)
    lo = tl.program_id(2) * t_per if SPLIT else 0
    for step in range(lo, tl.minimum(lo + t_per, steps) if SPLIT else steps):  # this split's channel blocks
        rc = step * BLOCK_K + tl.arange(0, BLOCK_K)
        c_ok = rc < C
        d = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for kh in tl.static_range(KH):
            ih = oh * sh - ph + kh * dh
            for kw in tl.static_range(KW):
                iw = ow * sw - pw + kw * dw
                ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                a = tl.load(x + (n * s_xn + ih * s_xh + iw * s_xw)[:, None] + rc[None, :] * s_xc,
                            mask=ok[:, None] & c_ok[None, :], other=0.0)
                b = tl.load(wd + (kh * KW + kw) * C + rc, mask=c_ok, other=0.0)
                d += a.to(tl.float32) * b.to(tl.float32)[None, :]
        if HAS_BD:
            d += tl.load(bd + rc, mask=c_ok, other=0.0).to(tl.float32)[None, :]
        d = activate(d, ACT1, alpha1, beta1).to(wp.dtype.element_ty)  # the map's values as the pair stores them
        # channels past C: their weight rows load as zeros, so whatever act1 made of them adds nothing
        wt = tl.load(wp + rc[:, None] * CO + rn[None, :], mask=c_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:
            acc = tl.dot(d.to(tl.float32), wt.to(tl.float32), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(d, wt, acc, input_precision=PRECISION)
    inside = p_ok[:, None] & n_ok[None, :]
    if SPLIT:  # the tile's last split to finish sums them all and alone runs the epilogue
        acc, last = split_k_sum(acc, ws, counts, BLOCK_M, BLOCK_N)
        inside = inside & last
    conv_epilogue(acc, bp, res, y, n, oh, ow, rn, n_ok, inside, alpha2, beta2,
                  s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BP, HAS_RES, ACT2)


def pack_weights(wd: torch.Tensor, wp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise [C, 1, KH, KW] → [KH·KW, C] (a tap's filters across the channels); 1x1 [CO, C, 1, 1] → [C, CO]."""
    return wd.reshape(wd.shape[0], -1).t().contiguous(), wp.reshape(wp.shape[0], -1).t().contiguous()


def configs(pixels: int | None, c: int, co: int, level: int, sms: int = 0) -> list[dict]:
    """Tiles no larger than the problem (output pixels, depthwise channels c, output channels co), best-first;
    fewer at low levels. tl.dot needs 16 of each dim. A tile whose grid fills under half of `sms` multiprocessors
    comes first split, one and two channel blocks a program, then whole."""
    limits = {"BLOCK_M": pow2(pixels or 16, 16, 128), "BLOCK_N": pow2(co, 16, 128), "BLOCK_K": pow2(c, 16, 64)}
    fallback = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 2}
    out = []
    for cfg in tile_configs(_SPACE, CONFIG_KEYS, limits, fallback, {}, 4):
        steps = triton.cdiv(c, cfg["BLOCK_K"])
        if pixels and 2 * triton.cdiv(pixels, cfg["BLOCK_M"]) * triton.cdiv(co, cfg["BLOCK_N"]) <= sms:
            out += [cfg | {"SPLIT_K": split} for split in dict.fromkeys((steps, triton.cdiv(steps, 2))) if split > 1]
        out.append(cfg)
    return out[:PER_LEVEL.get(level, len(out))]


def separable_conv2d(x: torch.Tensor, wd_packed: torch.Tensor, wp_packed: torch.Tensor, kernel: tuple[int, int],
                     strides, pads, dilations, bd: torch.Tensor | None = None, bp: torch.Tensor | None = None,
                     residual: torch.Tensor | None = None, *, act1: tuple[str, float, float] = ("none", 1.0, 0.0),
                     act2: tuple[str, float, float] = ("none", 1.0, 0.0), tf32: bool = False,
                     config: dict | None = None, out: torch.Tensor | None = None,
                     scratch: SplitScratch | None = None) -> torch.Tensor:
    """act2(act1(depthwise conv2d(x) + bd) · wp + bp + residual) as an NCHW-shaped, channels_last tensor in x's
    dtype (in `out`'s bytes when given). x [N, C, H, W] (any strides); weights from `pack_weights`; act1 / act2
    (activation, alpha, beta) of ACTIVATIONS; pads [top, left, bottom, right]. A config's SPLIT_K needs `scratch`
    (the caller's, kept while its kernel lives); it is dropped where the grid already fills the GPU."""
    for act in (act1[0], act2[0]):
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {act!r}")
    (n, c, h, wdt), (kh, kw), co = x.shape, kernel, wp_packed.shape[1]
    y = conv_output(x, co, kernel, strides, pads, dilations, out)
    oh, ow = y.shape[2:]
    if y.numel() == 0:
        return y
    cfg = config or configs(n * oh * ow, c, co, 1)[0]
    r = residual if residual is not None else y
    grid = (triton.cdiv(n * oh * ow, cfg["BLOCK_M"]), triton.cdiv(co, cfg["BLOCK_N"]))
    t_per, splits, ws, counts = split_k_plan(cfg, triton.cdiv(c, cfg["BLOCK_K"]), grid[0] * grid[1], x.device,
                                             scratch, y)
    _separable_kernel[grid + (splits,)](
        x, wd_packed, bd if bd is not None else y, wp_packed, bp if bp is not None else y, r, y,
        n, h, wdt, c, co, oh, ow, strides[0], strides[1], pads[0], pads[1], dilations[0], dilations[1],
        float(act1[1]), float(act1[2]), float(act2[1]), float(act2[2]), *x.stride(), *r.stride(), *y.stride(),
        ws, counts, t_per, KH=kh, KW=kw, HAS_BD=bd is not None, HAS_BP=bp is not None, HAS_RES=residual is not None, ACT1=act1[0],
        ACT2=act2[0], PRECISION=dot_precision(x.dtype, tf32), UPCAST=upcast_dot(x.dtype), BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], SPLIT=splits > 1, num_warps=cfg["num_warps"], **pdl_args(x.device))
    return y
