"""2-D convolution as an implicit GEMM: Y = act(X ⊛ W + bias + residual), fp32 accumulation, NHWC output.

Rows are output pixels (n, oh, ow), columns output channels, and the reduction runs over (kh, kw, c) with
the channel innermost, so a channels_last input is read in contiguous runs; no im2col buffer is made. The
weight is packed once at build time as [KH·KW·C, CO]. Inputs may have any strides; pads are explicit
(begins, ends); group 1 only. Configs are GEMM tiles pruned by the shared memory they take.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import (ACTIVATIONS, DEFAULT_SMEM, MAP_ARGS, SplitScratch, conv_epilogue, conv_output,
                                 dot_precision, output_pixels, pdl_args, pdl_start, pow2, split_k_configs, split_k_plan,
                                 split_k_sum, upcast_dot)

PER_LEVEL = {0: 1, 1: 1, 2: 2, 3: 3}  # unsplit configs offered per opt level; all from level 4
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
_SPACE = [(128, 64, 32, 4, 3), (64, 64, 32, 4, 3), (128, 128, 32, 8, 3), (64, 128, 32, 4, 3),
          (128, 128, 64, 8, 3), (32, 64, 32, 4, 4), (64, 32, 32, 2, 4), (16, 64, 64, 4, 3)]


@triton.jit
def _tap_tiles(x, w, n, ih, iw, c, rn, m_ok, n_ok, tap, H, W, C, CO, s_xn, s_xc, s_xh, s_xw, UPCAST: tl.constexpr):
    """The A tile (pixels × channels c of one kernel tap, zero outside the input) and its W tile (c × rn)."""
    row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    a = tl.load(x + (n * s_xn + ih * s_xh + iw * s_xw)[:, None] + c[None, :] * s_xc,
                mask=row_ok[:, None] & (c[None, :] < C), other=0.0)
    b = tl.load(w + (tap * C + c)[:, None] * CO + rn[None, :], mask=(c[:, None] < C) & n_ok[None, :], other=0.0)
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return a, b


@triton.jit(do_not_specialize=MAP_ARGS)
def _conv_kernel(x, w, bias, res, y, N, H, W, C, OH, OW, CO, KH, KW, sh, sw, ph, pw, dh, dw, act_alpha, act_beta,
                 s_xn, s_xc, s_xh, s_xw, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                 ws, counts, t_per,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    n, oh, ow, m_ok = output_pixels(N, OH, OW, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < CO
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SPLIT:  # one loop over (tap, channel block) steps, so loads pipeline across taps; this split's run of them
        cb = tl.cdiv(C, BLOCK_K)
        t_lo = tl.program_id(2) * t_per
        for t in range(t_lo, tl.minimum(t_lo + t_per, KH * KW * cb)):
            tap = t // cb
            kh = tap // KW
            a, b = _tap_tiles(x, w, n, oh * sh - ph + kh * dh, ow * sw - pw + (tap - kh * KW) * dw,
                              (t - tap * cb) * BLOCK_K + rk, rn, m_ok, n_ok, tap, H, W, C, CO, s_xn, s_xc, s_xh, s_xw,
                              UPCAST)
            acc += tl.dot(a, b, input_precision=PRECISION)
    else:
        for kh in range(0, KH):
            ih = oh * sh - ph + kh * dh
            for kw in range(0, KW):
                iw = ow * sw - pw + kw * dw
                for c0 in range(0, C, BLOCK_K):
                    a, b = _tap_tiles(x, w, n, ih, iw, c0 + rk, rn, m_ok, n_ok, kh * KW + kw, H, W, C, CO,
                                      s_xn, s_xc, s_xh, s_xw, UPCAST)
                    acc += tl.dot(a, b, input_precision=PRECISION)
    inside = m_ok[:, None] & n_ok[None, :]
    if SPLIT:  # the tile's last split to finish sums them all and alone runs the epilogue
        acc, last = split_k_sum(acc, ws, counts, BLOCK_M, BLOCK_N)
        inside = inside & last
    conv_epilogue(acc, bias, res, y, n, oh, ow, rn, n_ok, inside, act_alpha, act_beta,
                  s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS, HAS_RES, ACT)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """[CO, C, KH, KW] → [KH·KW·C, CO], the reduction order of the kernel (channel innermost)."""
    return w.permute(2, 3, 1, 0).reshape(-1, w.shape[0]).contiguous()


def smem_bytes(cfg: dict, itemsize: int) -> int:
    return cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * itemsize


def configs(m: int | None, co: int, c: int, itemsize: int, smem: int, level: int, sms: int = 0,
            taps: int = 1) -> list[dict]:
    """Tiles no larger than the problem (M output pixels, CO channels, C input channels) that fit `smem`,
    best-first; fewer at low levels (each config is one more kernel to compile in a cold build). From level 2,
    where the tiles fill under half of `sms` multiprocessors, split-K variants too (`split_k_configs`; `taps`: the
    kernel's KH·KW)."""
    out = []
    for t in _SPACE:
        cfg = dict(zip(CONFIG_KEYS, t))
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], pow2(c, 16, 64))
        while smem_bytes(cfg, itemsize) > smem and cfg["num_stages"] > 2:
            cfg["num_stages"] -= 1
        if (smem_bytes(cfg, itemsize) <= smem and cfg["BLOCK_M"] <= pow2(m or 128, 16, 128)
                and cfg["BLOCK_N"] <= pow2(co, 16, 128) and cfg not in out):
            out.append(cfg)
    out = out or [{"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 2, "num_stages": 2}]
    split = split_k_configs(out, m, co, c, sms, taps) if level >= 2 and m else []
    return out[:PER_LEVEL.get(level, len(out))] + [cfg for cfg in split if smem_bytes(cfg, itemsize) <= smem]


def conv2d(x: torch.Tensor, w_packed: torch.Tensor, kernel: tuple[int, int], strides, pads, dilations,
           bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, activation: str = "none",
           act_alpha: float = 1.0, act_beta: float = 0.0, config: dict | None = None,
           tf32: bool = False, out: torch.Tensor | None = None, scratch: SplitScratch | None = None) -> torch.Tensor:
    """act(conv2d(x, w) + bias + residual) as an NCHW-shaped, channels_last tensor in x's dtype (in `out`'s bytes
    when given).

    x [N, C, H, W] (any strides); w_packed from `pack_weight`; pads [top, left, bottom, right]. A config's SPLIT_K
    needs `scratch` (the caller's, kept while its kernel lives); it is dropped where the grid already fills the GPU."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    (n, c, h, wd), (kh, kw), co = x.shape, kernel, w_packed.shape[1]
    (sh, sw), (dh, dw) = strides, dilations
    y = conv_output(x, co, kernel, strides, pads, dilations, out)
    oh, ow = y.shape[2:]
    if y.numel() == 0:
        return y
    cfg = config or configs(n * oh * ow, co, c, x.element_size(), DEFAULT_SMEM, 1)[0]
    r = residual if residual is not None else y
    grid = (triton.cdiv(n * oh * ow, cfg["BLOCK_M"]), triton.cdiv(co, cfg["BLOCK_N"]))
    t_per, splits, ws, counts = split_k_plan(cfg, kh * kw * triton.cdiv(c, cfg["BLOCK_K"]), grid[0] * grid[1],
                                             x.device, scratch, y)
    _conv_kernel[grid + (splits,)](
        x, w_packed, bias if bias is not None else y, r, y, n, h, wd, c, oh, ow, co, kh, kw,
        sh, sw, pads[0], pads[1], dh, dw, float(act_alpha), float(act_beta),
        *x.stride(), *r.stride(), *y.stride(), ws, counts, t_per,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation,
        PRECISION=dot_precision(x.dtype, tf32), UPCAST=upcast_dot(x.dtype), SPLIT=splits > 1,
        **{key: cfg[key] for key in CONFIG_KEYS}, **pdl_args(x.device))
    return y
