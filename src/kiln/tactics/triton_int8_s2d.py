"""Stride-2 QuantConv with few input channels (ResNet's 7x7 stem on 3) as space-to-depth + a stride-1 conv on 16
channels (kernels/space_to_depth.py): the image's quantized pixels are regrouped once, then the implicit-GEMM
conv (kernels/int8_conv.py) runs the ⌈K/2⌉x⌈K/2⌉ conv as a ⌈K/2⌉x1 conv of S's overlapping row view, each
kernel row one contiguous 64-byte load per pixel. The same integer sums as the stride-2 conv, so the same bits;
the autotuner keeps it only where it is faster.

triton_int8_conv_s2d runs int8 layers, triton_fp8_conv_s2d fp8 e4m3 ones; triton_int8_conv_s2d_halo runs the
4x1 conv through the halo-box conv (kernels/int8_conv_halo.py, Hopper), its rows by TMA from the overlapping view.
tactics/quant_conv.py registers all three."""

from __future__ import annotations

from kiln.kernels import int8_conv, int8_conv_halo, space_to_depth
from kiln.kernels.common import smem_limit
from kiln.kinds.conv import resolve_pads
from kiln.kinds.qtype import INT8
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.int8_common import (gluon_epilogue_kwargs, gluon_epilogue_reason, qtype_reason, tma_device_reason,
                                      triton_epilogue_kwargs)
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import mark_nhwc

CHANNELS = 16  # S's channels: 4·C ≤ 16, and 16 bytes make a TMA row


def s2d_reason(spec: LayerSpec, kinds: tuple[str, ...] = ("QuantConv",)) -> str | None:
    """Why space-to-depth cannot run this conv (of one of `kinds`), or None: a stride-2 stem on ≤ 4 channels."""
    a, w = spec.attrs, spec.inputs[1].const
    if spec.kind not in kinds or w is None or w.dim() != 4:
        return "2-D convolutions only"
    if tuple(a.get("strides", (1, 1))) != (2, 2) or tuple(a.get("dilations", (1, 1))) != (1, 1) or \
            a.get("group", 1) != 1:
        return "stride 2, dilation 1, group 1 only"
    if 4 * w.shape[1] > CHANNELS:
        return f"more than {CHANNELS // 4} input channels (space-to-depth pays for stem convs only)"
    out = spec.outputs[0].shape
    if not out or not all(isinstance(d, int) for d in out[2:]):
        return "output size not static"
    return None


def conv_configs(spec: LayerSpec, device, level: int):
    out, (co, _, _, kw) = spec.outputs[0].shape, spec.inputs[1].const.shape
    m = out[0] * out[2] * out[3] if isinstance(out[0], int) else None
    row = (kw + 1) // 2 * CHANNELS  # the view's channels: one kernel row of S
    return mark_nhwc(int8_conv.configs(m, co, row, smem_limit(device), level))


def _rows_of(spec: LayerSpec):
    """The layer's GEMM form, the row-view weight (packed) and a function from the image to S's row view."""
    w = spec.inputs[1].const
    k2, size = space_to_depth.geometry(tuple(w.shape[2:]), tuple(spec.outputs[0].shape[2:]))
    packed = int8_conv.pack_weight(space_to_depth.row_weight(space_to_depth.weight(w, CHANNELS)))
    pads = resolve_pads(tuple(spec.inputs[0].shape[2:]), spec.attrs)[:2]

    def rows(x):
        return space_to_depth.rows(space_to_depth.space_to_depth(x, pads, size, CHANNELS), k2[1])

    return int8_lowering.gemm_form(spec), packed, rows, k2


def compile_conv(spec: LayerSpec, config, device):
    a = spec.attrs
    form, packed, rows, k2 = _rows_of(spec)
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(triton_epilogue_kwargs(a), config={k: config[k] for k in int8_conv.CONFIG_KEYS})

    def run(inputs, out=None):
        return [int8_conv.conv2d(rows(inputs[0]), packed, form.scale, (k2[0], 1), (1, 1), [0, 0, 0, 0], (1, 1),
                                 form.bias, inputs[4] if has_residual else None, out=first(out), **kw)]

    return run


def _halo_geometry(spec: LayerSpec) -> tuple[tuple[int, int], int]:
    """The halo conv's kernel over S's row view (KH rows of one tap) and the view's channels."""
    kh, kw = spec.inputs[1].const.shape[2:]
    return ((kh + 1) // 2, 1), (kw + 1) // 2 * CHANNELS


def halo_configs(spec: LayerSpec, device, level: int):
    out, co = spec.outputs[0].shape, spec.inputs[1].const.shape[0]
    kernel, c = _halo_geometry(spec)
    return mark_nhwc(int8_conv_halo.configs(kernel, out[2], out[3], co, c, smem_limit(device),
                                            int8_lowering.has_residual(spec)))


def supports_halo(spec: LayerSpec, device) -> str | None:
    if not int8_conv_halo.available():
        return int8_conv_halo.UNAVAILABLE
    reason = s2d_reason(spec) or qtype_reason(spec, device, INT8) or gluon_epilogue_reason(spec) or \
        tma_device_reason(device)
    if reason is None and not halo_configs(spec, device, 3):
        return "no tile fits shared memory"
    return reason


def compile_halo(spec: LayerSpec, config, device):
    a = spec.attrs
    form, packed, rows, _ = _rows_of(spec)
    has_residual = int8_lowering.has_residual(spec)
    kernel, _ = _halo_geometry(spec)
    kw = dict(gluon_epilogue_kwargs(a), config={k: config[k] for k in int8_conv_halo.CONFIG_KEYS})

    def run(inputs, out=None):
        return [int8_conv_halo.conv2d(rows(inputs[0]), packed, form.scale, kernel, [0, 0, 0, 0], form.bias,
                                      inputs[4] if has_residual else None, out=first(out), **kw)]

    return run
