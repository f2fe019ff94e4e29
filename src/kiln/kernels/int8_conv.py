"""2-D int8 or fp8 (e4m3) convolution as an implicit GEMM with kiln's quantized epilogue (kinds/quantized.py has
the arithmetic): no im2col buffer, int32 (int8) or fp32 (fp8) accumulation, NHWC output (channels_last), out in
the input's quantized type or float.

Rows are output pixels (n, oh, ow), columns output channels; the reduction runs over (kh, kw, c) in one flat
loop of BLOCK_K channel blocks per tap (so the compiler pipelines it), channel innermost: a channels_last input
is read in contiguous runs. The weight is [KH·KW·C, CO] in the input's type (kernels/conv.py's order), best
K-major (`pack_weight`): Hopper's 8-bit tensor-core instructions take only K-major operands from shared memory.
Epilogue as kernels/int8_gemm.py: fp32(acc)·scale[co] + bias + residual (float, or of the input's type times
`res_scale`), activation, then requantization or a float store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kiln.kernels import conv
from kiln.kernels.common import ACTIVATIONS, DEFAULT_SMEM, output_pixels, pow2
from kiln.kernels.int8_gemm import FP8_PROMOTE, MIN_BLOCK_K, QUANTIZED_OPERANDS, check_residual, epilogue, \
    load_operand, residual_tile
from kiln.kernels.out_buffer import take
from kiln.kinds.quantized import inv_scale

CONFIG_KEYS = conv.CONFIG_KEYS
OUTSIDE = tl.constexpr(1 << 20)  # an offset that puts a row or tap beyond every input (masked, never read)
_SPACE_8BIT = [(128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
               (128, 128, 128, 8, 3), (64, 128, 64, 4, 4)]


@triton.jit
def _int8_conv_kernel(x, w, scale, bias, res, y, N, H, W, C, OH, OW, CO, KW, sh, sw, ph, pw, dh, dw, NUM_K, KTOT,
                      out_inv, res_scale, act_alpha, act_beta, s_wk, s_wn, s_xn, s_xc, s_xh, s_xw, s_rn, s_rc,
                      s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                      RES_Q: tl.constexpr, REQUANT: tl.constexpr, ACT: tl.constexpr, FP8: tl.constexpr,
                      FLAT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n, oh, ow, m_ok = output_pixels(N, OH, OW, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < CO
    c_blocks = tl.cdiv(C, BLOCK_K)
    if FP8:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    if FLAT_K:  # per output pixel once: its window's corner (rows past the end far outside) and base offset
        ih0 = tl.where(m_ok, oh * sh - ph, -OUTSIDE)
        iw0 = ow * sw - pw
        base = n * s_xn + ih0 * s_xh + iw0 * s_xw
    for kb in range(0, NUM_K):
        if FLAT_K:  # few channels (a stem conv): the block runs over taps and channels at once, k = tap·C + c,
            k = kb * BLOCK_K + rk  # gathered as a [K, M] tile: lanes run along output pixels, a few bytes apart;
            tap = k // C  # per element only two adds, two unsigned compares and the offset's add
            c = k % C
            dr = tl.where(k < KTOT, (tap // KW) * dh, -OUTSIDE)
            ds = (tap % KW) * dw
            ih = (ih0[None, :] + dr[:, None]).to(tl.uint32)
            iw = (iw0[None, :] + ds[:, None]).to(tl.uint32)
            a_ok = (ih < H) & (iw < W)  # unsigned: a negative index is past every bound
            koff = dr * s_xh + ds * s_xw + c * s_xc
            a = tl.trans(load_operand(x + (base[None, :] + koff[:, None]), a_ok, FP8))
            b = load_operand(w + k[:, None] * s_wk + rn[None, :] * s_wn, (k < KTOT)[:, None] & n_ok[None, :],
                             FP8)
        else:
            tap = kb // c_blocks
            c = (kb % c_blocks) * BLOCK_K + rk
            ih = oh * sh - ph + (tap // KW) * dh
            iw = ow * sw - pw + (tap % KW) * dw
            row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = load_operand(x + (n * s_xn + ih * s_xh + iw * s_xw)[:, None] + c[None, :] * s_xc,
                             row_ok[:, None] & (c[None, :] < C), FP8)
            b = load_operand(w + (tap * C + c)[:, None] * s_wk + rn[None, :] * s_wn,
                             (c[:, None] < C) & n_ok[None, :], FP8)
        if FP8:
            acc = tl.dot(a, b, acc, out_dtype=tl.float32, max_num_imprecise_acc=FP8_PROMOTE)
        else:
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    store_pixels(acc, n, oh, ow, m_ok, rn, n_ok, res, y, scale, bias, out_inv, res_scale, act_alpha, act_beta, s_rn,
                 s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS, HAS_RES, RES_Q, REQUANT, ACT, FP8)


@triton.jit
def store_pixels(acc, n, oh, ow, rows_ok, rn, n_ok, res, y, scale, bias, out_inv, res_scale, act_alpha, act_beta,
                 s_rn, s_rc, s_rh, s_rw, s_yn, s_yc, s_yh, s_yw, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                 RES_Q: tl.constexpr, REQUANT: tl.constexpr, ACT: tl.constexpr, FP8: tl.constexpr):
    """A conv tile's quantized epilogue and store, its rows output pixels (n, oh, ow), its columns channels rn
    (the implicit-GEMM convs here and in kernels/int8_conv_tma.py share it)."""
    inside = rows_ok[:, None] & n_ok[None, :]
    r = 0.0
    if HAS_RES:
        r = residual_tile(res + (n * s_rn + oh * s_rh + ow * s_rw)[:, None] + rn[None, :] * s_rc, inside, res_scale,
                          RES_Q, FP8)
    v = epilogue(acc, scale, bias, rn, n_ok, r, act_alpha, act_beta, out_inv, HAS_BIAS, HAS_RES, ACT, REQUANT, FP8)
    tl.store(y + (n * s_yn + oh * s_yh + ow * s_yw)[:, None] + rn[None, :] * s_yc, v.to(y.dtype.element_ty),
             mask=inside)


def check_operands(x: torch.Tensor, w_packed: torch.Tensor, residual: torch.Tensor | None, res_scale: float | None,
                   activation: str) -> None:
    """ValueError unless the conv's operands are both int8 or both fp8, the activation is known and the
    residual's type matches `res_scale` (kernels/int8_gemm.check_residual)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    if x.dtype not in QUANTIZED_OPERANDS or w_packed.dtype != x.dtype:
        raise ValueError(f"operands must be both int8 or both float8_e4m3fn, got {x.dtype} and {w_packed.dtype}")
    check_residual(residual, res_scale, x.dtype)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """[CO, C, KH, KW] → a [KH·KW·C, CO] view of K-major memory ([CO, KH·KW·C] contiguous)."""
    return w.permute(0, 2, 3, 1).reshape(w.shape[0], -1).contiguous().t()


def configs(m: int | None, co: int, c: int, smem: int, level: int) -> list[dict]:
    """8-bit tiles first (wider and deeper than the fp16 conv's: 1-byte operands, 32-deep MMAs), then
    kernels/conv.py's tiles with BLOCK_K raised to the MMA depth; all that fit `smem` and the problem."""
    out = []
    for t in _SPACE_8BIT:
        cfg = dict(zip(CONFIG_KEYS, t))
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], pow2(c, MIN_BLOCK_K, 128))
        if (cfg["BLOCK_M"] <= pow2(m or 256, 16, 256) and cfg["BLOCK_N"] <= pow2(co, 16, 256)
                and conv.smem_bytes(cfg, 1) <= smem and cfg not in out):
            out.append(cfg)
    for cfg in conv.configs(m, co, c, 1, smem, max(level, 4)):
        cfg = dict(cfg, BLOCK_K=max(cfg["BLOCK_K"], MIN_BLOCK_K))
        if conv.smem_bytes(cfg, 1) <= smem and cfg not in out:
            out.append(cfg)
    return out[:conv.PER_LEVEL.get(level, len(out))]


def conv2d(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor, kernel: tuple[int, int], strides, pads,
           dilations, bias: torch.Tensor | None = None, residual: torch.Tensor | None = None, *,
           out_scale: float | None = None, res_scale: float | None = None, activation: str = "none",
           act_alpha: float = 1.0, act_beta: float = 0.0, out_dtype: torch.dtype = torch.float32,
           config: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The quantized conv of x [N, C, H, W] (int8 or fp8 e4m3, any strides) with `w_packed` ([KH·KW·C, CO], any
    strides: `pack_weight` of the weight, same type); scale fp32 [CO] = x_scale·w_scale; pads [top, left, bottom,
    right]; a residual of x's type needs `res_scale`. NCHW-shaped, channels_last."""
    check_operands(x, w_packed, residual, res_scale, activation)
    (n, c, h, wd), (kh, kw), co = x.shape, kernel, w_packed.shape[1]
    (sh, sw), (dh, dw) = strides, dilations
    oh = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    dtype = x.dtype if out_scale is not None else out_dtype
    y = take(out, (n, co, oh, ow), dtype, x.device, torch.channels_last)  # in `out`'s bytes when given
    if y.numel() == 0:
        return y
    cfg = config or configs(n * oh * ow, co, c, DEFAULT_SMEM, 1)[0]
    r = residual if residual is not None else y
    grid = (triton.cdiv(n * oh * ow, cfg["BLOCK_M"]), triton.cdiv(co, cfg["BLOCK_N"]))
    flat = c < cfg["BLOCK_K"]  # channel blocks would be mostly padding: reduce over (tap, channel) at once
    num_k = triton.cdiv(kh * kw * c, cfg["BLOCK_K"]) if flat else kh * kw * triton.cdiv(c, cfg["BLOCK_K"])
    _int8_conv_kernel[grid](x, w_packed, scale, bias if bias is not None else scale, r, y, n, h, wd, c, oh, ow, co,
                            kw, sh, sw, pads[0], pads[1], dh, dw, num_k, kh * kw * c,
                            inv_scale(out_scale) if out_scale is not None else 1.0,
                            float(res_scale or 1.0), float(act_alpha), float(act_beta), *w_packed.stride(),
                            *x.stride(), *r.stride(), *y.stride(), HAS_BIAS=bias is not None,
                            HAS_RES=residual is not None,
                            RES_Q=res_scale is not None, REQUANT=out_scale is not None, ACT=activation,
                            FP8=x.dtype == torch.float8_e4m3fn, FLAT_K=flat,
                            enable_fp_fusion=False, **{key: cfg[key] for key in CONFIG_KEYS})
    return y
