"""Reference implementations of the convolution kinds (through torch.nn.functional, fp32 accumulate).

Spatial attributes shared by every kind here (n = number of spatial dims), as the importer leaves them:
  kernel_shape [n], strides [n], dilations [n], group int,
  pads [2n] = [begin_0..begin_{n-1}, end_0..end_{n-1}] (explicit; may be recomputed from auto_pad),
  auto_pad "NOTSET" once pads are explicit; "SAME_UPPER"/"SAME_LOWER" only when the input's spatial
  shape was unknown at import, in which case the reference derives pads from the runtime shape.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kiln.kinds.registry import INT, INTS, NONE, STR, kind

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def same_pads(in_spatial, kernel, strides, dilations, auto_pad: str) -> list[int]:
    """Explicit [begins..., ends...] pads for auto_pad SAME_UPPER/SAME_LOWER (output = ceil(in / stride))."""
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
        total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(large if auto_pad == "SAME_LOWER" else small)
        ends.append(small if auto_pad == "SAME_LOWER" else large)
    return begins + ends


def resolve_pads(in_spatial, attrs: dict) -> list[int]:
    """The layer's explicit pads, computing them from auto_pad and the runtime shape where needed."""
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return same_pads(in_spatial, attrs["kernel_shape"], attrs["strides"], attrs["dilations"], auto_pad)
    if auto_pad == "VALID":
        return [0] * (2 * len(in_spatial))
    return list(attrs["pads"])


def pointwise(attrs: dict, w: torch.Tensor | None) -> bool:
    """A 2-D conv with a 1x1 weight, no padding and one group (any stride): a GEMM over (a subsample of) its
    input's pixels."""
    return w is not None and w.dim() == 4 and tuple(w.shape[2:]) == (1, 1) and not any(attrs.get("pads", [0])) \
        and attrs.get("group", 1) == 1 and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID")


def pad_spatial(x: torch.Tensor, pads: list[int], value: float = 0.0) -> torch.Tensor:
    """Pad (negative: crop) the trailing len(pads)//2 dims of x by ONNX-ordered [begins..., ends...]."""
    n = len(pads) // 2
    if not any(pads):
        return x
    torch_pads = [p for i in reversed(range(n)) for p in (pads[i], pads[n + i])]
    return F.pad(x, torch_pads, value=value)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a reference computes in: fp32 for half types (fp32 accumulate), else the dtype itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def conv_nd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, attrs: dict) -> torch.Tensor:
    """Convolution of same-dtype float tensors with ONNX attributes; asymmetric pads are applied first."""
    n = x.dim() - 2
    pads = resolve_pads(x.shape[2:], attrs)
    if pads[:n] == pads[n:]:
        padding = pads[:n]
    else:
        x, padding = pad_spatial(x, pads), 0
    return _CONV[n](x, w, b, attrs["strides"], padding, attrs["dilations"], attrs["group"])


@kind("Conv", attrs={"auto_pad": STR, "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS.req,
                     "pads": INTS.req, "strides": INTS.req})
def conv(inputs, attrs):
    """ONNX Conv: inputs (X, W, optional B)."""
    x, w, b = (inputs + [None] * 3)[:3]
    dt = compute_dtype(x.dtype)
    return conv_nd(x.to(dt), w.to(dt), None if b is None else b.to(dt), attrs).to(x.dtype)


def transpose_pads(in_spatial, attrs) -> list[int]:
    """ConvTranspose pads: explicit, or derived from output_shape / auto_pad as the ONNX spec says."""
    auto_pad, out_shape = attrs.get("auto_pad", "NOTSET"), attrs.get("output_shape")
    if not out_shape and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return [0] * (2 * len(in_spatial)) if auto_pad == "VALID" else list(attrs["pads"])
    if not out_shape:
        out_shape = [size * s for size, s in zip(in_spatial, attrs["strides"])]
    begins, ends = [], []
    for size, k, s, d, op, out in zip(in_spatial, attrs["kernel_shape"], attrs["strides"], attrs["dilations"],
                                      attrs["output_padding"], out_shape[-len(in_spatial):]):
        total = s * (size - 1) + op + (k - 1) * d + 1 - out
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


@kind("ConvTranspose", attrs={"auto_pad": STR, "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS.req,
                              "output_padding": INTS.req, "output_shape": NONE, "pads": INTS.req, "strides": INTS.req})
def conv_transpose(inputs, attrs):
    """ONNX ConvTranspose: inputs (X, W, optional B); extra attributes output_padding [n], output_shape [n]|None.

    The full transposed convolution is computed unpadded, then cropped by pads (negative pads and
    output_padding extend it with zeros), then the bias is added.
    """
    x, w, b = (inputs + [None] * 3)[:3]
    n, dt = x.dim() - 2, compute_dtype(x.dtype)
    pads = transpose_pads(x.shape[2:], attrs)
    y = _CONV_T[n](x.to(dt), w.to(dt), None, attrs["strides"], 0, 0, attrs["group"], attrs["dilations"])
    y = pad_spatial(y, [-p for p in pads[:n]] + [op - p for op, p in zip(attrs["output_padding"], pads[n:])])
    if b is not None:
        y = y + b.to(dt).reshape(-1, *[1] * n)
    return y.to(x.dtype)


def _int_conv(x, w, x_zp, w_zp, attrs) -> torch.Tensor:
    """Integer convolution of (x - x_zp) and (w - w_zp), exact in float64; padding reads as x_zp."""
    x = x.double() - (0 if x_zp is None else x_zp.double())
    w = w.double() - (0 if w_zp is None else w_zp.double().reshape(-1, *[1] * (w.dim() - 1)))
    return conv_nd(x, w, None, attrs)


@kind("ConvInteger", attrs={"auto_pad": STR, "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS.req,
                            "pads": INTS.req, "strides": INTS.req})
def conv_integer(inputs, attrs):
    """ONNX ConvInteger: inputs (X, W, optional x_zero_point, optional w_zero_point) → int32."""
    x, w, x_zp, w_zp = (inputs + [None] * 4)[:4]
    return _int_conv(x, w, x_zp, w_zp, attrs).to(torch.int32)


def requantize(acc: torch.Tensor, multiplier: torch.Tensor, y_zp: torch.Tensor | None,
               out_dtype: torch.dtype) -> torch.Tensor:
    """round_half_even(acc · multiplier) + y_zp, saturated to out_dtype (the QLinear* output stage)."""
    y = torch.round(acc * multiplier.double()) + (0 if y_zp is None else y_zp.double())
    info = torch.iinfo(out_dtype)
    return y.clamp(info.min, info.max).to(out_dtype)


@kind("QLinearConv", attrs={"auto_pad": STR, "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS.req,
                            "pads": INTS.req, "strides": INTS.req})
def qlinear_conv(inputs, attrs):
    """ONNX QLinearConv: inputs (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, optional int32 B)."""
    x, xs, x_zp, w, ws, w_zp, ys, y_zp, b = (inputs + [None] * 9)[:9]
    acc = _int_conv(x, w, x_zp, w_zp, attrs)
    n = x.dim() - 2
    if b is not None:
        acc = acc + b.double().reshape(-1, *[1] * n)
    multiplier = (xs * ws / ys).reshape(-1, *[1] * n)  # per output channel when w_scale is 1-D
    return requantize(acc, multiplier, y_zp, x.dtype if y_zp is None else y_zp.dtype)


def _bilinear_zero(img: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Sample img (B, C, H, W) at float points y, x (B, P) bilinearly, reading zeros outside → (B, C, P)."""
    height, width = img.shape[-2:]
    flat = img.flatten(2)
    y0, x0 = y.floor(), x.floor()
    out = 0
    for yy, xx in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
        weight = (1 - (y - yy).abs()) * (1 - (x - xx).abs())
        weight = weight * ((yy >= 0) & (yy < height) & (xx >= 0) & (xx < width))
        index = (yy.clamp(0, height - 1) * width + xx.clamp(0, width - 1)).long()
        out = out + flat.gather(2, index[:, None].expand(-1, flat.shape[1], -1)) * weight[:, None]
    return out


def _tap_positions(out_len: int, stride: int, pad: int, kernel: int, dilation: int, like: torch.Tensor):
    """Input coordinate of every (kernel tap, output position) pair along one axis → (kernel, out_len)."""
    out = torch.arange(out_len, dtype=like.dtype, device=like.device) * stride - pad
    return out[None, :] + (torch.arange(kernel, dtype=like.dtype, device=like.device) * dilation)[:, None]


@kind("DeformConv", attrs={"auto_pad": STR, "dilations": INTS.req, "group": INT.req, "kernel_shape": INTS,
                           "offset_group": INT.req, "pads": INTS.req, "strides": INTS.req})
def deform_conv(inputs, attrs):
    """ONNX DeformConv (2-D): inputs (X, W, offset, optional B, optional mask); extra attribute offset_group.

    Each kernel tap samples X bilinearly at its offset position; the sampled columns, scaled by the
    mask, are contracted with W per group.
    """
    x, w, offset, b, mask = (inputs + [None] * 5)[:5]
    dt = compute_dtype(x.dtype)
    x, w, offset = x.to(dt), w.to(dt), offset.to(dt)
    (batch, chans), (kh, kw), (oh, ow) = x.shape[:2], w.shape[2:], offset.shape[2:]
    og, group, (sh, sw), (dh, dw), pads = (attrs["offset_group"], attrs["group"], attrs["strides"],
                                           attrs["dilations"], attrs["pads"])
    rows = _tap_positions(oh, sh, pads[0], kh, dh, x)[:, None, :, None]  # (kh, 1, oh, 1)
    cols = _tap_positions(ow, sw, pads[1], kw, dw, x)[None, :, None, :]  # (1, kw, 1, ow)
    offset = offset.reshape(batch * og, kh, kw, 2, oh, ow)
    ys = (rows + offset[:, :, :, 0]).flatten(1)
    xs = (cols + offset[:, :, :, 1]).flatten(1)
    taps = _bilinear_zero(x.reshape(batch * og, chans // og, *x.shape[2:]), ys, xs)
    taps = taps.reshape(batch, og, chans // og, kh * kw, oh * ow)
    if mask is not None:
        taps = taps * mask.to(dt).reshape(batch, og, 1, kh * kw, oh * ow)
    taps = taps.reshape(batch, group, -1, oh * ow)
    y = torch.einsum("gok,bgkp->bgop", w.reshape(group, w.shape[0] // group, -1), taps).reshape(batch, -1, oh, ow)
    if b is not None:
        y = y + b.to(dt).reshape(-1, 1, 1)
    return y.to(inputs[0].dtype)
