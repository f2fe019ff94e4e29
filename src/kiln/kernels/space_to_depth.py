"""Space-to-depth of a stride-2 conv's input, so the conv runs as a stride-1 conv on 16 channels:

    S[n, channel(c, dy, dx), i, j] = x[n, c, 2i + dy - pt, 2j + dx - pl]   (zero outside x and for c ≥ C)

A KHxKW stride-2 conv of x with pads (pt, pl) equals a ⌈KH/2⌉x⌈KW/2⌉ stride-1, unpadded conv of S whose weight is
W'[co, channel(c, dy, dx), a, b] = W[co, c, 2a + dy, 2b + dx] (zero past KH, KW): every product of the original
sum appears once. For a stem conv (C ≤ 4) this turns a 147-long gather per output pixel into 16-channel rows a
TMA box or a plain row load can fetch. A program reads each input row as one contiguous run and writes each S
pixel as one 16-byte store. Works on any element type; writes NHWC (channels_last) memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import pdl_args, pdl_start
from kiln.kernels.int8_gemm import load_operand

CHANNELS = 16  # S's channels: four input channels (zero-padded) at four parities
BLOCK_J = 128  # S pixels per program: a stem's whole row (115 at 224 pixels)


def channel(c: int, dy: int, dx: int) -> int:
    """S's channel of input channel c at row parity dy and column parity dx: the order the kernel's joins build."""
    return dx * 8 + dy * 4 + (c % 2) * 2 + c // 2


@triton.jit
def _plane(base, c: tl.constexpr, ih, iw, H, W, s_xc, s_xh, C: tl.constexpr, FP8: tl.constexpr):
    """Input channel c of row ih at the columns iw [BLOCK_J, 2] (both parities), zero outside x or past C."""
    ok = (c < C) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    return load_operand(base + c * s_xc + ih * s_xh, ok, FP8)


@triton.jit
def _pair(base, c: tl.constexpr, ih, iw, H, W, s_xc, s_xh, C: tl.constexpr, FP8: tl.constexpr):
    """Channel c at both row parities: [BLOCK_J, 2 (dx), 2 (dy)]."""
    return tl.join(_plane(base, c, ih, iw, H, W, s_xc, s_xh, C, FP8),
                   _plane(base, c, ih + 1, iw, H, W, s_xc, s_xh, C, FP8))


@triton.jit
def _s2d_kernel(x, s, H, W, HS, WS, pt, pl, s_xn, s_xc, s_xh, s_xw, C: tl.constexpr, FP8: tl.constexpr,
                BLOCK_J: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
    row = tl.program_id(0)  # n·HS + i: one row of S
    n, i = row // HS, row % HS
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    iw = 2 * j[:, None] + tl.arange(0, 2)[None, :] - pl  # [BLOCK_J, 2]: the pixel's two columns, contiguous
    base = x + n.to(tl.int64) * s_xn + iw * s_xw
    ih = 2 * i - pt
    a = tl.join(_pair(base, 0, ih, iw, H, W, s_xc, s_xh, C, FP8), _pair(base, 1, ih, iw, H, W, s_xc, s_xh, C, FP8))
    b = tl.join(_pair(base, 2, ih, iw, H, W, s_xc, s_xh, C, FP8), _pair(base, 3, ih, iw, H, W, s_xc, s_xh, C, FP8))
    v = tl.reshape(tl.join(a, b), (BLOCK_J, 16))  # [j, dx, dy, c % 2, c // 2]: `channel`'s order
    ch = tl.arange(0, 16)
    tl.store(s + (row.to(tl.int64) * WS + j[:, None]) * 16 + ch[None, :], v, mask=(j < WS)[:, None])


def geometry(kernel: tuple[int, int], out_hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(the stride-1 kernel, S's spatial size) for a stride-2 `kernel` producing `out_hw`."""
    k2 = ((kernel[0] + 1) // 2, (kernel[1] + 1) // 2)
    return k2, (out_hw[0] + k2[0] - 1, out_hw[1] + k2[1] - 1)


def space_to_depth(x: torch.Tensor, pads: tuple[int, int], size: tuple[int, int],
                   channels: int = CHANNELS) -> torch.Tensor:
    """S (module docstring) of x [N, C ≤ 4, H, W] (any strides) with begin pads (pt, pl) and spatial `size`, as an
    NCHW-shaped channels_last tensor of x's type."""
    n, c, h, w = x.shape
    hs, ws = size
    if channels != CHANNELS or c > CHANNELS // 4:
        raise ValueError(f"S has {CHANNELS} channels, for at most {CHANNELS // 4} input channels; got {channels}, {c}")
    s = torch.empty((n, CHANNELS, hs, ws), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if s.numel():
        _s2d_kernel[(n * hs, triton.cdiv(ws, BLOCK_J))](x, s, h, w, hs, ws, pads[0], pads[1], *x.stride(), C=c,
                                                        FP8=x.dtype == torch.float8_e4m3fn, BLOCK_J=BLOCK_J,
                                                        **pdl_args(x.device))
    return s


def weight(w: torch.Tensor, channels: int = CHANNELS) -> torch.Tensor:
    """W' [CO, 16, ⌈KH/2⌉, ⌈KW/2⌉] (module docstring) of a stride-2 weight [CO, C ≤ 4, KH, KW]."""
    co, c, kh, kw = w.shape
    if channels != CHANNELS or c > CHANNELS // 4:
        raise ValueError(f"S has {CHANNELS} channels, for at most {CHANNELS // 4} input channels")
    k2 = ((kh + 1) // 2, (kw + 1) // 2)
    padded = torch.zeros((co, 4, 2 * k2[0], 2 * k2[1]), dtype=torch.float32, device=w.device)
    padded[:, :c, :kh, :kw] = w.float()
    # [co, c // 2, c % 2, a, dy, b, dx] → [co, dx, dy, c % 2, c // 2, a, b]: `channel`'s order
    t = padded.view(co, 2, 2, k2[0], 2, k2[1], 2).permute(0, 6, 4, 2, 1, 3, 5)
    return t.reshape(co, CHANNELS, *k2).to(w.dtype)


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
