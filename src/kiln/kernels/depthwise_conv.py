"""Depthwise 2-D convolution (one filter per channel: group = C = CO) with bias, residual and activation fused:
Y = act(X ⊛ W + bias + residual), fp32 accumulation, NHWC output.

A depthwise conv has no reduction over channels, so it runs on CUDA cores, not tensor cores: each program takes a
tile of output pixels × channels and adds KH·KW shifted input tiles, each read across contiguous channels of a
channels_last input. It is bound by its bytes (MobileNetV2's layers: cuDNN took 2-3.5× their memory time). The
pixels are a run of the flattened output (TILE_W 0) or a 2-D patch BLOCK_P / TILE_W rows by TILE_W columns, whose
taps overlap more (faster for stride-2 layers on an H200, not for stride-1 ones). A 3x3 conv of stride 1 or 2 can
also sweep down a band of BLOCK_R output rows (`_rows_kernel`): each input row is loaded once per column tap, not once
per tap, and feeds every output row it touches through carried accumulators.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels.common import (ACTIVATIONS, FEW_ROWS, MAP_ARGS, TMA_ALIGN, TensorDescriptor, conv_epilogue,
                                 conv_output, interleave, output_pixels, pdl_args, pdl_start, pow2, tile_configs)

CONFIG_KEYS = ("BLOCK_P", "BLOCK_C", "num_warps", "TILE_W", "BLOCK_R", "TMA_STAGES")
# best-first on an H200 (MobileNetV2 b64, gpu_cuda_core_conv_probe, 2026-11-29): flat runs win the stride-1 layers,
# 2-D patches the stride-2 ones (68.4 against 74.5 µs at 96 channels @ 112², 36.6 against 41.5 at 144 @ 56²)
_SPACE = [t + (0, 0) for t in [
    (64, 32, 4, 0), (128, 32, 4, 0), (64, 64, 4, 0), (32, 64, 4, 0), (64, 32, 4, 8), (128, 32, 4, 16),
    (16, 128, 4, 0), (32, 128, 8, 0), (128, 64, 8, 0), (8, 256, 4, 0), (64, 64, 4, 8), (64, 32, 4, 16),
    (32, 64, 4, 8), (256, 32, 8, 16), (128, 64, 8, 16), (16, 128, 4, 4)]]
# row sweeps (3x3, stride 1 or 2): BLOCK_P output columns × BLOCK_C channels, down BLOCK_R rows
_ROWS = [t + (0,) for t in [
    (32, 32, 4, 0, 8), (64, 32, 4, 0, 8), (16, 64, 4, 0, 8), (32, 64, 4, 0, 8), (8, 128, 4, 0, 8),
    (64, 16, 4, 0, 8), (32, 32, 4, 0, 16), (32, 32, 2, 0, 4), (16, 32, 2, 0, 4), (8, 64, 2, 0, 4),
    (64, 64, 8, 0, 8), (128, 32, 8, 0, 8)]]
# stride-1 row sweeps on TMA loads, TMA_STAGES deep (gpu_depthwise_rows_probe, H200, b64: 65.5 against the best
# flat tile's 87.9 µs at 144 channels @ 56², 51.3 against 60.3 at 32 @ 112²; 3 stages beat 2 everywhere)
_TMA = [(64, 32, 4, 0, 8, 3), (32, 64, 4, 0, 8, 3), (16, 64, 4, 0, 8, 3), (64, 32, 4, 0, 8, 4), (8, 128, 4, 0, 8, 3),
        (32, 32, 4, 0, 8, 3), (64, 32, 4, 0, 4, 3), (32, 64, 4, 0, 8, 4), (16, 128, 8, 0, 8, 3), (8, 64, 2, 0, 4, 3),
        (64, 64, 8, 0, 8, 3), (128, 32, 8, 0, 8, 4)]
PER_LEVEL = {0: 1, 1: 2, 2: 4, 3: 6}  # configs offered per opt level; all from level 4


@triton.jit(do_not_specialize=MAP_ARGS)
def _depthwise_kernel(x, w, bias, res, y, N, H, W, C, OH, OW, sh, sw, ph, pw, dh, dw, act_alpha, act_beta,
                      s_xn, s_xc, s_xh, s_xw, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                      KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                      ACT: tl.constexpr, EVEN_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                      TILE_W: tl.constexpr, PDL: tl.constexpr):
    pdl_start(PDL)
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


@triton.jit
def _filter_row(w, kh, C, rc, c_ok):
    """Row kh of packed 3x3 filters: its three column taps across the channels, [1, BLOCK_C] fp32 each."""
    t = w + kh * 3 * C + rc
    return (tl.load(t, mask=c_ok, other=0.0).to(tl.float32)[None, :],
            tl.load(t + C, mask=c_ok, other=0.0).to(tl.float32)[None, :],
            tl.load(t + 2 * C, mask=c_ok, other=0.0).to(tl.float32)[None, :])


@triton.jit
def _tap(row, iw, W, ok, cols, c_ok, s_xw, EVEN_C: tl.constexpr):
    """One input row's values at columns iw across the channels (zero outside the row), fp32."""
    m = ok & (iw >= 0) & (iw < W)
    mask = m[:, None] if EVEN_C else m[:, None] & c_ok[None, :]
    return tl.load(row + (iw * s_xw)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _row_taps(x, n, ih, H, iw, W, p_ok, cols, c_ok, s_xn, s_xh, s_xw, EVEN_C: tl.constexpr):
    """Input row ih at the three column taps iw, iw + 1, iw + 2 of the output columns."""
    row, ok = x + n * s_xn + ih * s_xh, p_ok & (ih >= 0) & (ih < H)
    return (_tap(row, iw, W, ok, cols, c_ok, s_xw, EVEN_C), _tap(row, iw + 1, W, ok, cols, c_ok, s_xw, EVEN_C),
            _tap(row, iw + 2, W, ok, cols, c_ok, s_xw, EVEN_C))


@triton.jit
def _box(xd, n, ih, iw, c0, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """BLOCK_P columns × BLOCK_C channels of input row ih from column iw: a TMA box of an [N, H, W, C] descriptor
    (zero outside the tensor)."""
    return xd.load([n, ih, iw, c0]).reshape(BLOCK_P, BLOCK_C)


@triton.jit
def _evens_odds(v, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """A [2·BLOCK_P, BLOCK_C] tile's even and odd rows."""
    return tl.split(v.reshape(BLOCK_P, 2, BLOCK_C).permute(0, 2, 1))


@triton.jit
def _taps(x, n, ih, H, iw, w0, W, p_ok, cols, c_ok, c0, s_xn, s_xh, s_xw, STRIDE: tl.constexpr,
          EVEN_C: tl.constexpr, TMA: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Input row ih at the three column taps of the output columns (iw = ow·STRIDE − pad, w0 = the tile's first iw),
    fp32: pointer loads, or (TMA) boxes; at stride 2 two boxes of 2·BLOCK_P columns, split into even and odd."""
    if TMA:
        if STRIDE == 1:
            a = _box(x, n, ih, w0, c0, BLOCK_P, BLOCK_C)
            b = _box(x, n, ih, w0 + 1, c0, BLOCK_P, BLOCK_C)
            c = _box(x, n, ih, w0 + 2, c0, BLOCK_P, BLOCK_C)
        else:
            a, b = _evens_odds(_box(x, n, ih, w0, c0, 2 * BLOCK_P, BLOCK_C), BLOCK_P, BLOCK_C)
            c, _ = _evens_odds(_box(x, n, ih, w0 + 2, c0, 2 * BLOCK_P, BLOCK_C), BLOCK_P, BLOCK_C)
        a, b, c = a.to(tl.float32), b.to(tl.float32), c.to(tl.float32)
    else:
        a, b, c = _row_taps(x, n, ih, H, iw, W, p_ok, cols, c_ok, s_xn, s_xh, s_xw, EVEN_C)
    return a, b, c


@triton.jit(do_not_specialize=MAP_ARGS)
def _rows_kernel(x, w, bias, res, y, N, H, W, C, OH, OW, ph, pw, act_alpha, act_beta,
                 s_xn, s_xc, s_xh, s_xw, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                 STRIDE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
                 EVEN_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
                 TMA_STAGES: tl.constexpr, PDL: tl.constexpr):
    """A 3x3 depthwise conv of stride 1 or 2 (dilation 1) over a band of BLOCK_R output rows × BLOCK_P columns ×
    BLOCK_C channels; the channel blocks of a tile are neighbouring programs, so they share the input's lines.
    TMA_STAGES > 0: x is an [N, H, W, C] descriptor, its rows loaded TMA_STAGES deep ahead of the math, which keeps
    enough bytes in flight (pointer loads reached a third of the HBM's rate)."""
    pdl_start(PDL)
    c_blocks, w_tiles, bands = tl.cdiv(C, BLOCK_C), tl.cdiv(OW, BLOCK_P), tl.cdiv(OH, BLOCK_R)
    pid = tl.program_id(0)
    cb, tile = pid % c_blocks, pid // c_blocks
    n, o0 = tile // (bands * w_tiles), (tile // w_tiles) % bands * BLOCK_R
    w0 = tile % w_tiles * BLOCK_P
    ow = w0 + tl.arange(0, BLOCK_P)
    p_ok, iw = ow < OW, ow * STRIDE - pw
    rc = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = (rc >= 0) if EVEN_C else (rc < C)
    cols = rc * s_xc
    f00, f01, f02 = _filter_row(w, 0, C, rc, c_ok)
    f10, f11, f12 = _filter_row(w, 1, C, rc, c_ok)
    f20, f21, f22 = _filter_row(w, 2, C, rc, c_ok)
    rows, c0, first = tl.minimum(BLOCK_R, OH - o0), cb * BLOCK_C, w0 * STRIDE - pw
    if STRIDE == 1:  # input row o0 - ph + t is tap row 2 of output o0 + t - 2, row 1 of the next, row 0 of the last
        done, acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32), tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
        for t in tl.range(0, rows + 2, num_stages=max(TMA_STAGES, 1)):
            a, b, c = _taps(x, n, o0 - ph + t, H, iw, first, W, p_ok, cols, c_ok, c0, s_xn, s_xh, s_xw, STRIDE,
                            EVEN_C, TMA_STAGES, BLOCK_P, BLOCK_C)
            if t >= 2:
                _store_row(done + a * f20 + b * f21 + c * f22, bias, res, y, n, o0 + t - 2, ow, p_ok, rc, c_ok,
                           act_alpha, act_beta, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                           HAS_BIAS, HAS_RES, ACT, EVEN_C)
            done, acc = acc + a * f10 + b * f11 + c * f12, a * f00 + b * f01 + c * f02
    else:  # input row 2·o - ph + 2 is tap row 2 of output o and tap row 0 of output o + 1
        a, b, c = _taps(x, n, 2 * o0 - ph, H, iw, first, W, p_ok, cols, c_ok, c0, s_xn, s_xh, s_xw, STRIDE, EVEN_C,
                        TMA_STAGES, BLOCK_P, BLOCK_C)
        carry = a * f00 + b * f01 + c * f02
        for j in tl.range(0, rows, num_stages=max(TMA_STAGES, 1)):
            ih = 2 * (o0 + j) - ph
            a, b, c = _taps(x, n, ih + 1, H, iw, first, W, p_ok, cols, c_ok, c0, s_xn, s_xh, s_xw, STRIDE, EVEN_C,
                            TMA_STAGES, BLOCK_P, BLOCK_C)
            acc = carry + a * f10 + b * f11 + c * f12
            a, b, c = _taps(x, n, ih + 2, H, iw, first, W, p_ok, cols, c_ok, c0, s_xn, s_xh, s_xw, STRIDE, EVEN_C,
                            TMA_STAGES, BLOCK_P, BLOCK_C)
            _store_row(acc + a * f20 + b * f21 + c * f22, bias, res, y, n, o0 + j, ow, p_ok, rc, c_ok,
                       act_alpha, act_beta, s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw,
                       HAS_BIAS, HAS_RES, ACT, EVEN_C)
            carry = a * f00 + b * f01 + c * f02


@triton.jit
def _store_row(acc, bias, res, y, n, oh, ow, p_ok, rc, c_ok, act_alpha, act_beta, s_rn, s_rc, s_rh, s_rw,
               s_yn, s_yc, s_yh, s_yw, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
               EVEN_C: tl.constexpr):
    """Output row oh's tile through the conv epilogue."""
    inside = p_ok[:, None] if EVEN_C else p_ok[:, None] & c_ok[None, :]
    conv_epilogue(acc, bias, res, y, n, oh + ow * 0, ow, rc, c_ok, inside, act_alpha, act_beta,
                  s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS, HAS_RES, ACT)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """[C, 1, KH, KW] → [KH·KW, C]: each tap's filters across the channels, read contiguously."""
    return w.reshape(w.shape[0], -1).t().contiguous()


def sweeps_rows(kernel, strides, dilations) -> bool:
    """Whether `_rows_kernel` computes this conv: 3x3, dilation 1, stride 1 or 2 both ways."""
    return tuple(kernel) == (3, 3) and tuple(dilations) == (1, 1) and tuple(strides) in ((1, 1), (2, 2))


def configs(pixels: int | None, c: int, level: int, ow: int | None = None, oh: int | None = None,
            rows: bool = False, tma: bool = False, stride: int = 1, itemsize: int = 2) -> list[dict]:
    """Tiles no larger than the problem (output pixels, channels, output width and height), best-first; fewer at
    low levels. `rows`: the conv can sweep rows (`sweeps_rows`), so row-sweep tiles are offered too; `tma`: and its
    channels fill 16-byte rows on a device with TMA, so TMA sweeps are offered, leading the sweeps (they won at both
    strides from 28² up on an H200). Under FEW_ROWS output pixels sweeps come after every flat run and patch."""
    cap_c = pow2(c, 8, 256)
    flat = tile_configs(_SPACE, CONFIG_KEYS, {"BLOCK_C": cap_c, "BLOCK_P": pow2(pixels or 128, 8, 256),
                                              "TILE_W": pow2(ow or 16, 4, 16)},
                        dict(zip(CONFIG_KEYS, (16, pow2(c, 8, 64), 2, 0, 0, 0))), PER_LEVEL, 4)
    if rows:
        limits = {"BLOCK_C": cap_c, "BLOCK_P": pow2(ow or 64, 8, 128), "BLOCK_R": pow2(oh or 16, 4, 16)}
        sweeps = [tile_configs(space, CONFIG_KEYS, limits, {}, PER_LEVEL, 4) for space in
                  ((_TMA, _ROWS) if tma else (_ROWS,))]
        lead, *rest = [[cfg for cfg in sweep if cfg and _tma_smem(cfg, stride, itemsize) <= TMA_SMEM]
                       for sweep in sweeps]  # none fits under 16 channels
        if pixels is not None and pixels < FEW_ROWS:  # batch 1: sweeps lost to flat runs and patches (stop 51)
            flat = flat + lead
        else:
            flat = interleave(lead, flat)
        flat += sum(rest, [])
    return flat[:PER_LEVEL.get(level, len(flat))]


TMA_SMEM = 192 * 1024  # shared memory a TMA sweep may take: an H100's 227 KB less Triton's own


def _tma_smem(cfg: dict, stride: int, itemsize: int) -> int:
    """Shared memory of a TMA sweep's pipeline: TMA_STAGES - 1 loop turns of boxes (three a row at stride 1, two rows
    of two boxes twice as wide at stride 2), 0 for pointer loads."""
    boxes = 3 * cfg["BLOCK_P"] if stride == 1 else 8 * cfg["BLOCK_P"]
    return max(cfg["TMA_STAGES"] - 1, 0) * boxes * cfg["BLOCK_C"] * itemsize


def tma_addressable(x: torch.Tensor) -> bool:
    """Whether x [N, C, H, W] can be read through an [N, H, W, C] TMA descriptor: dense channels_last, 16-byte
    channel rows and base."""
    return (x.permute(0, 2, 3, 1).is_contiguous() and (x.shape[1] * x.element_size()) % TMA_ALIGN == 0
            and x.data_ptr() % TMA_ALIGN == 0)


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
    even_c, block_r = c % cfg["BLOCK_C"] == 0, cfg.get("BLOCK_R", 0)
    if block_r:
        if not sweeps_rows(kernel, strides, dilations):
            raise ValueError("row-sweep tiles (BLOCK_R) take 3x3 convs of stride 1 or 2 and dilation 1")
        grid = (triton.cdiv(c, cfg["BLOCK_C"]) * n * triton.cdiv(oh, block_r) * triton.cdiv(ow, cfg["BLOCK_P"]),)
        stages = cfg.get("TMA_STAGES", 0) if tma_addressable(x) else 0  # else the same on pointers
        src = (TensorDescriptor.from_tensor(x.permute(0, 2, 3, 1), [1, 1, cfg["BLOCK_P"] * sh, cfg["BLOCK_C"]])
               if stages else x)
        _rows_kernel[grid](src, w_packed, bias if bias is not None else y, r, y, n, h, wd, c, oh, ow, pads[0], pads[1],
                           float(act_alpha), float(act_beta), *x.stride(), *r.stride(), *y.stride(), STRIDE=sh,
                           HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation, EVEN_C=even_c,
                           BLOCK_P=cfg["BLOCK_P"], BLOCK_C=cfg["BLOCK_C"], BLOCK_R=block_r, TMA_STAGES=stages,
                           num_warps=cfg["num_warps"], **pdl_args(x.device))
        return y
    tile_w = cfg.get("TILE_W", 0)
    pixel_tiles = (n * triton.cdiv(oh, cfg["BLOCK_P"] // tile_w) * triton.cdiv(ow, tile_w) if tile_w
                   else triton.cdiv(n * oh * ow, cfg["BLOCK_P"]))
    grid = (pixel_tiles, triton.cdiv(c, cfg["BLOCK_C"]))
    _depthwise_kernel[grid](x, w_packed, bias if bias is not None else y, r, y, n, h, wd, c, oh, ow, sh, sw,
                            pads[0], pads[1], dh, dw, float(act_alpha), float(act_beta),
                            *x.stride(), *r.stride(), *y.stride(), KH=kh, KW=kw,
                            HAS_BIAS=bias is not None, HAS_RES=residual is not None, ACT=activation,
                            EVEN_C=even_c, BLOCK_P=cfg["BLOCK_P"], BLOCK_C=cfg["BLOCK_C"],
                            TILE_W=tile_w, num_warps=cfg["num_warps"], **pdl_args(x.device))
    return y
