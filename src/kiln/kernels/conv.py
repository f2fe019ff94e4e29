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

from kiln.kernels.common import (ACTIVATIONS, DEFAULT_SMEM, conv_epilogue, conv_output, dot_precision, output_pixels,
                                pow2, upcast_dot)

PER_LEVEL = {0: 1, 1: 1, 2: 2, 3: 3}  # configs offered per opt level; all from level 4
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
_SPACE = [(128, 64, 32, 4, 3), (64, 64, 32, 4, 3), (128, 128, 32, 8, 3), (64, 128, 32, 4, 3),
          (128, 128, 64, 8, 3), (32, 64, 32, 4, 4), (64, 32, 32, 2, 4), (16, 64, 64, 4, 3)]


@triton.jit
def _conv_kernel(x, w, bias, res, y, N, H, W, C, OH, OW, CO, KH, KW, sh, sw, ph, pw, dh, dw, act_alpha, act_beta,
                 s_xn, s_xc, s_xh, s_xw, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr, PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n, oh, ow, m_ok = output_pixels(N, OH, OW, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < CO
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kh in range(0, KH):
        ih = oh * sh - ph + kh * dh
        for kw in range(0, KW):
            iw = ow * sw - pw + kw * dw
            row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            x_row = x + n * s_xn + ih * s_xh + iw * s_xw
            w_row = (kh * KW + kw) * C
            for c0 in range(0, C, BLOCK_K):
                c = c0 + rk
                a = tl.load(x_row[:, None] + c[None, :] * s_xc, mask=row_ok[:, None] & (c[None, :] < C), other=0.0)
                b = tl.load(w + (w_row + c)[:, None] * CO + rn[None, :], mask=(c[:, None] < C) & n_ok[None, :],
                            other=0.0)
                if UPCAST:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc += tl.dot(a, b, input_precision=PRECISION)
    conv_epilogue(acc, bias, res, y, n, oh, ow, rn, n_ok, m_ok[:, None] & n_ok[None, :], act_alpha, act_beta,
                  s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS, HAS_RES, ACT)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """[CO, C, KH, KW] → [KH·KW·C, CO], the reduction order of the kernel (channel innermost)."""
    return w.permute(2, 3, 1, 0).reshape(-1, w.shape[0]).contiguous()


def smem_bytes(cfg: dict, itemsize: int) -> int:
    return cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * itemsize


def configs(m: int | None, co: int, c: int, itemsize: int, smem: int, level: int) -> list[dict]:
    """Tiles no larger than the problem (M output pixels, CO channels, C input channels) that fit `smem`,
    best-first; fewer at low levels (each config is one more kernel to compile in a cold build)."""
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
    return out[:PER_LEVEL.get(level, len(out))]


def conv2d(x: torch.Tensor, w_packed: torch.Tensor, kernel: tuple[int, int], strides, pads, dilations,
           bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *, activation: str = "none",
           act_alpha: float = 1.0, act_beta: float = 0.0, config: dict | None = None,
           tf32: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """act(conv2d(x, w) + bias + residual) as an NCHW-shaped, channels_last tensor in x's dtype (in `out`'s bytes
    when given).

    x [N, C, H, W] (any strides); w_packed from `pack_weight`; pads [top, left, bottom, right]."""
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
    _conv_kernel[grid](x, w_packed, bias if bias is not None else y, r, y, n, h, wd, c, oh, ow, co, kh, kw,
                       sh, sw, pads[0], pads[1], dh, dw, float(act_alpha), float(act_beta),
                       *x.stride(), *r.stride(), *y.stride(),
                       HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation,
                       PRECISION=dot_precision(x.dtype, tf32), UPCAST=upcast_dot(x.dtype),
                       **{key: cfg[key] for key in CONFIG_KEYS})
    return y
