"""int8 QuantGemm and 1x1 QuantConv through the Gluon GEMM that keeps one wgmma in flight (or, for reductions short
enough to stay in shared memory, its persistent streaming variant), QuantConv through its implicit-GEMM
conv (5-D TMA input boxes fed to wgmma from shared memory; a strided 1x1 conv as its input's subsampled view, other
strided convs through the stride-phase view), both in kernels/int8_gemm_wgmma.py, and stride-1
QuantConv through the halo-box conv (kernels/int8_conv_halo.py, each input pixel read KW times from L2, not KH·KW),
Hopper only: the layers whose epilogue they have (ReLU, erf GELU or none, int8 out, an int8 residual) and whose
rows TMA can address (multiples of 16 channels). The autotuner times them against
the Triton tactics, whose int8 dots Triton cannot keep in flight. This module holds the launchers:
triton_int8_gemm_wgmma is registered by tactics/quant_gemm.py, triton_int8_conv_wgmma and triton_int8_conv_halo by
tactics/quant_conv.py."""

from __future__ import annotations

from kiln.kernels import int8_conv, int8_conv_halo, int8_gemm_wgmma
from kiln.kernels.common import smem_limit
from kiln.kinds.conv import resolve_pads
from kiln.kinds.qtype import INT8
from kiln.tactics import int8_lowering
from kiln.tactics.common import first
from kiln.tactics.int8_common import (gemm_rows, gluon_epilogue_kwargs, gluon_epilogue_reason, mark_nhwc, nhwc,
                                      out_hw, tma_conv_reason, tma_device_reason)
from kiln.tactics.spec import LayerSpec


def _gemm_reason(spec: LayerSpec) -> str | None:
    a, w = spec.attrs, spec.inputs[1].const
    if spec.kind == "QuantConv" and (w.dim() != 4 or tuple(w.shape[2:]) != (1, 1) or any(a.get("pads", [0]))
                                     or tuple(a.get("strides", (1, 1))) != (1, 1) or a.get("group", 1) != 1):
        return "1x1, stride-1, unpadded convs only (their rows are a view)"
    if w.shape[0] % 16 or w[0].numel() % 16:
        return "K and N must be multiples of 16 (TMA's 16-byte rows)"
    return None


def supports_gemm(spec: LayerSpec, device) -> str | None:
    return int8_lowering.supports(spec, INT8) or gluon_epilogue_reason(spec) or _gemm_reason(spec) or \
        tma_device_reason(device)


def gemm_configs(spec: LayerSpec, device, level: int):
    """The streaming kernel's tiles first where the reduction stays whole in shared memory, then the pipelined ones."""
    w, smem = spec.inputs[1].const, smem_limit(device)
    n, k = w.shape[0], w[0].numel()
    return nhwc(spec, int8_gemm_wgmma.stream_configs(n, k, smem, int8_lowering.has_residual(spec))
                + int8_gemm_wgmma.configs(gemm_rows(spec), n, k, smem))


def compile_gemm(spec: LayerSpec, config, device):
    form = int8_lowering.gemm_form(spec)
    a = spec.attrs
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(gluon_epilogue_kwargs(a), config={k: v for k, v in config.items() if k != "layout"})

    def run(inputs, out=None):
        x = inputs[0]
        res = form.res_rows(inputs[4]) if has_residual else None
        return [form.back(int8_gemm_wgmma.matmul(form.rows(x), form.w, form.scale, form.bias, res, out=first(out),
                                                 **kw), x)]

    return run


def _strides(spec: LayerSpec) -> tuple[int, int]:
    """The strides the kernel applies: none for a strided 1x1 conv, which runs on its input's subsample view."""
    return (1, 1) if int8_lowering.subsample(spec) else tuple(spec.attrs.get("strides", (1, 1)))


def _strided_reason(spec: LayerSpec) -> str | None:
    """Why the phase view (kernels/int8_gemm_wgmma.phase_view) cannot take this strided conv's input, or None."""
    a, w, shape, strides = spec.attrs, spec.inputs[1].const, spec.inputs[0].shape, _strides(spec)
    if spec.kind != "QuantConv" or w is None or w.dim() != 4 or a.get("group", 1) != 1:
        return "2-D convolutions of group 1 only"
    if not all(isinstance(d, int) for d in shape[2:]) or shape[2] % strides[0] or shape[3] % strides[1]:
        return "strided convs of static maps whose sides are multiples of the strides only"
    if w.shape[1] % 64 or any(p >= 8 * st for p, st in zip(resolve_pads(tuple(shape[2:]), a), strides * 2)):
        return "strided convs of multiples of 64 channels and pads below 8·stride only"
    return None


def supports_conv(spec: LayerSpec, device) -> str | None:
    reason = tma_conv_reason(spec) if _strides(spec) == (1, 1) else _strided_reason(spec)
    return int8_lowering.supports(spec, INT8) or gluon_epilogue_reason(spec) or reason or tma_device_reason(device)


def conv_configs(spec: LayerSpec, device, level: int):
    """The kernel's tiles; a strided conv's only where BLOCK_K divides C (a phase's channels end at C)."""
    (oh, ow), (co, c) = out_hw(spec), spec.inputs[1].const.shape[:2]
    strided = _strides(spec) != (1, 1)
    return mark_nhwc(cfg for cfg in int8_gemm_wgmma.conv_configs(oh, ow, co, c, smem_limit(device))
                     if not (strided and c % cfg["BLOCK_K"]))


def compile_conv(spec: LayerSpec, config, device):
    a, form = spec.attrs, int8_lowering.gemm_form(spec)
    w = int8_conv.pack_weight(spec.inputs[1].const)
    pads = list(resolve_pads(tuple(spec.inputs[0].shape[2:]), a))
    kernel, dilations = tuple(spec.inputs[1].const.shape[2:]), tuple(a["dilations"])
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(gluon_epilogue_kwargs(a), config={k: config[k] for k in int8_gemm_wgmma.CONV_KEYS if k in config},
              strides=_strides(spec))
    step = int8_lowering.subsample(spec) or (1, 1)

    def run(inputs, out=None):
        x = inputs[0][:, :, ::step[0], ::step[1]]
        return [int8_gemm_wgmma.conv2d(x, w, form.scale, kernel, pads, dilations, form.bias,
                                       inputs[4] if has_residual else None, out=first(out), **kw)]

    return run


def _halo_reason(spec: LayerSpec) -> str | None:
    a, w = spec.attrs, spec.inputs[1].const
    if spec.kind != "QuantConv" or w is None or w.dim() != 4:
        return "2-D convolutions only"
    if w.shape[2] < 2:
        return "kernels of two or more rows only (one row has no halo to share: a GEMM)"
    if tuple(a.get("strides", (1, 1))) != (1, 1) or tuple(a.get("dilations", (1, 1))) != (1, 1) or \
            a.get("group", 1) != 1:
        return "stride 1, dilation 1, group 1 only"
    return None


def supports_halo(spec: LayerSpec, device) -> str | None:
    if not int8_conv_halo.available():
        return int8_conv_halo.UNAVAILABLE
    reason = int8_lowering.supports(spec, INT8) or gluon_epilogue_reason(spec) or _halo_reason(spec) or \
        tma_device_reason(device)
    if reason is None and not halo_configs(spec, device, 3):
        return "no tile fits: channels not multiples of 16, or the weight block too big for shared memory"
    return reason


def halo_configs(spec: LayerSpec, device, level: int):
    (oh, ow), (co, c, kh, kw) = out_hw(spec), spec.inputs[1].const.shape
    return mark_nhwc(int8_conv_halo.configs((kh, kw), oh, ow, co, c, smem_limit(device),
                                            int8_lowering.has_residual(spec)))


def compile_halo(spec: LayerSpec, config, device):
    a, form = spec.attrs, int8_lowering.gemm_form(spec)
    w = int8_conv.pack_weight(spec.inputs[1].const)
    pads = list(resolve_pads(tuple(spec.inputs[0].shape[2:]), a))
    kernel = tuple(spec.inputs[1].const.shape[2:])
    has_residual = int8_lowering.has_residual(spec)
    kw = dict(gluon_epilogue_kwargs(a), config={k: config[k] for k in int8_conv_halo.CONFIG_KEYS})

    def run(inputs, out=None):
        return [int8_conv_halo.conv2d(inputs[0], w, form.scale, kernel, pads, form.bias,
                                      inputs[4] if has_residual else None, out=first(out), **kw)]

    return run
