"""Space-to-depth of a stride-2 conv's input, so the conv runs as a stride-1 conv on 4× the channels:

    S[n, (2·dy + dx)·C + c, i, j] = x[n, c, 2i + dy - pt, 2j + dx - pl]   (zero outside x; channels past 4·C
    up to `channels` are zero)

A KHxKW stride-2 conv of x with pads (pt, pl) equals a ⌈KH/2⌉x⌈KW/2⌉ stride-1, unpadded conv of S whose weight is
W'[co, (2·dy + dx)·C + c, a, b] = W[co, c, 2a + dy, 2b + dx] (zero past KH, KW): every product of the original
sum appears once. For a stem conv (C = 3) this turns a 147-long gather per output pixel into 16-channel rows a
TMA box or a plain row load can fetch. Works on any element type; writes NHWC (channels_last) memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.int8_gemm import load_operand

BLOCK_J = 64  # S pixels per program, each a row of `channels` bytes: no per-element index division


@triton.jit
def _s2d_kernel(x, s, C, H, W, HS, WS, pt, pl, s_xn, s_xc, s_xh, s_xw, FP8: tl.constexpr, CS: tl.constexpr,
                BLOCK_J: tl.constexpr):
    row = tl.program_id(0)  # n·HS + i: one row of S
    n, i = row // HS, row % HS
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    ch = tl.arange(0, CS)
    c, d = ch % C, ch // C
    ih = 2 * i + d // 2 - pt
    iw = 2 * j[:, None] + (d % 2)[None, :] - pl
    ok = (j < WS)[:, None] & ((d < 4) & (ih >= 0) & (ih < H))[None, :] & (iw >= 0) & (iw < W)
    src = x + n.to(tl.int64) * s_xn + (c * s_xc + ih * s_xh)[None, :] + iw * s_xw
    v = load_operand(src, ok, FP8)
    tl.store(s + row.to(tl.int64) * WS * CS + j[:, None] * CS + ch[None, :], v, mask=(j < WS)[:, None])


def geometry(kernel: tuple[int, int], out_hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(the stride-1 kernel, S's spatial size) for a stride-2 `kernel` producing `out_hw`."""
    k2 = ((kernel[0] + 1) // 2, (kernel[1] + 1) // 2)
    return k2, (out_hw[0] + k2[0] - 1, out_hw[1] + k2[1] - 1)


def space_to_depth(x: torch.Tensor, pads: tuple[int, int], size: tuple[int, int], channels: int) -> torch.Tensor:
    """S (module docstring) of x [N, C, H, W] (any strides) with begin pads (pt, pl), spatial `size` and
    `channels` ≥ 4·C channels, as an NCHW-shaped channels_last tensor."""
    n, c, h, w = x.shape
    hs, ws = size
    if channels & (channels - 1) or channels < 4 * c:
        raise ValueError(f"channels must be a power of two ≥ 4·C = {4 * c}, got {channels}")
    s = torch.empty((n, channels, hs, ws), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if s.numel():
        _s2d_kernel[(n * hs, triton.cdiv(ws, BLOCK_J))](x, s, c, h, w, hs, ws, pads[0], pads[1], *x.stride(),
                                                        FP8=x.dtype == torch.float8_e4m3fn, CS=channels,
                                                        BLOCK_J=BLOCK_J)
    return s


def weight(w: torch.Tensor, channels: int) -> torch.Tensor:
    """W' [CO, channels, ⌈KH/2⌉, ⌈KW/2⌉] (module docstring) of a stride-2 weight [CO, C, KH, KW]."""
    co, c, kh, kw = w.shape
    k2 = ((kh + 1) // 2, (kw + 1) // 2)
    padded = torch.zeros((co, c, 2 * k2[0], 2 * k2[1]), dtype=torch.float32, device=w.device)
    padded[:, :, :kh, :kw] = w.float()
    # [co, c, a, dy, b, dx] → [co, dy, dx, c, a, b] → channels (2·dy + dx)·C + c
    t = padded.view(co, c, k2[0], 2, k2[1], 2).permute(0, 3, 5, 1, 2, 4).reshape(co, 4 * c, *k2)
    out = torch.zeros((co, channels, *k2), dtype=torch.float32, device=w.device)
    out[:, :4 * c] = t
    return out.to(w.dtype)


def rows(s: torch.Tensor, kw: int) -> torch.Tensor:
    """S (from `space_to_depth`) seen as [N, kw·CS, HS, WS - kw + 1] whose channel b·CS + c at pixel j is S's
    channel c at pixel j + b: the kw taps of a kernel row are one contiguous run of kw·CS bytes, so a KHxKW conv
    of S is a KHx1 conv of this overlapping view (weight from `row_weight`) with kw·CS-long channel loads."""
    n, cs, hs, ws = s.shape
    return s.as_strided((n, kw * cs, hs, ws - kw + 1), (s.stride(0), 1, s.stride(2), cs))


def row_weight(w: torch.Tensor) -> torch.Tensor:
    """[CO, KW·C, KH, 1] for `rows`' view of a [CO, C, KH, KW] weight: channel b·C + c holds tap (a, b)'s c."""
    co, c, kh, kw = w.shape
    return w.permute(0, 3, 1, 2).reshape(co, kw * c, kh, 1)
