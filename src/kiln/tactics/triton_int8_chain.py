"""QuantConvChain (an int8 1x1 conv, or conv pair, and the 1x1 conv reading its output, quant/fuse_conv_chain.py):
through the Gluon chain kernel (kernels/int8_gemm_chain.py, Hopper: the first output is written once and never read
back), or, on any GPU, as Triton implicit-GEMM convs (kernels/int8_conv.py), the second reading the first's output.
This module holds the launchers and checks; tactics/quant_conv_chain.py registers the tactics."""

from __future__ import annotations

from kiln.kernels import int8_conv, int8_gemm_chain
from kiln.kernels.common import smem_limit
from kiln.kinds.qtype import INT8
from kiln.kinds.quantized import second_attrs
from kiln.tactics import int8_lowering
from kiln.tactics.common import rank
from kiln.tactics.int8_common import tma_device_reason
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import act_kwargs, epilogue, mark_nhwc

X, W, W_SCALE, BIAS, R, W2, W2_SCALE, BIAS2, XS, WS, WS_SCALE, BIAS_S = range(12)  # QuantConvChain's inputs


def _input(spec: LayerSpec, k: int):
    """Input k's spec, None when absent (a chain without a pair's shortcut conv has eight inputs)."""
    return spec.inputs[k] if len(spec.inputs) > k else None


def supports_chain(spec: LayerSpec, device) -> str | None:
    a, i = spec.attrs, [_input(spec, k) for k in range(12)]
    if spec.kind != "QuantConvChain" or int8_lowering.qtype(spec) is not INT8:
        return "int8 QuantConvChain only"
    consts = (W, W_SCALE, W2, W2_SCALE) + ((WS, WS_SCALE) if i[XS] is not None else ())
    if any(i[k] is None or i[k].const is None for k in consts) or any(
            i[k] is not None and i[k].const is None for k in (BIAS, BIAS2, BIAS_S)):
        return "weights, scales and biases must be build-time constants"
    if rank(i[X]) != 4 or not i[X].static:
        return "2-D convolutions with static shapes only"
    if any(act not in int8_lowering.ACTIVATIONS for act in (a.get("activation", "none"), a["activation2"])) or \
            a.get("out_scale") is None or a.get("out2_scale") is None:
        return "int8 outputs with the int8 epilogue's activations only"
    if i[R] is not None and (i[R].dtype is not INT8.dtype or a.get("res_scale") is None):
        return "int8 residuals only"
    return None


def _constants(spec: LayerSpec):
    """Both convs' [CO, C] weights, combined scales and biases (None when absent), then the pair's shortcut conv's
    (None when the chain has none)."""
    a, i = spec.attrs, spec.inputs
    w, w2 = (_matrix(spec, k) for k in (W, W2))
    out = (w, int8_lowering.combined_scale(a["x_scale"], i[W_SCALE].const), int8_lowering.const_bias(spec, BIAS),
           w2, int8_lowering.combined_scale(a["out_scale"], i[W2_SCALE].const), int8_lowering.const_bias(spec, BIAS2))
    if _input(spec, XS) is None:
        return out + (None,)
    return out + ((_matrix(spec, WS), int8_lowering.combined_scale(a["x2_scale"], i[WS_SCALE].const),
                   int8_lowering.const_bias(spec, BIAS_S)),)


def _matrix(spec: LayerSpec, k: int):
    """A 1x1 conv weight input as [CO, C]."""
    w = spec.inputs[k].const
    return w.reshape(w.shape[:2]).contiguous()


def compile_split(spec: LayerSpec, config, device):
    a = spec.attrs
    w, scale, bias, w2, scale2, bias2, shortcut = _constants(spec)
    w, w2 = (int8_conv.pack_weight(t[:, :, None, None]) for t in (w, w2))
    if shortcut is not None:
        shortcut = (int8_conv.pack_weight(shortcut[0][:, :, None, None]), *shortcut[1:])
    b = second_attrs(a)
    acts, acts2 = act_kwargs(a), act_kwargs(b)
    conv = dict(kernel=(1, 1), pads=[0] * 4, dilations=(1, 1), config={k: config[k] for k in int8_conv.CONFIG_KEYS})

    def run(inputs, out=None):
        r = inputs[R]
        if shortcut is not None:  # the pair's second conv: its fp32 value as a float residual (triton_int8_pair)
            ws, scale_s, bias_s = shortcut
            r = int8_conv.conv2d(inputs[XS], ws, scale_s, strides=tuple(a["strides2"]), bias=bias_s, **conv)
        y = int8_conv.conv2d(inputs[X], w, scale, strides=(1, 1), bias=bias, residual=r, out_scale=a["out_scale"],
                             res_scale=a.get("res_scale"), **acts, out=out[0] if out else None, **conv)
        return [y, int8_conv.conv2d(y, w2, scale2, strides=(1, 1), bias=bias2, out_scale=b["out_scale"], **acts2,
                                    out=out[1] if out else None, **conv)]

    return run


def _shape(spec: LayerSpec) -> tuple[int, int, int, bool, int]:
    """(K, N, N2, residual, K of the shortcut conv or 0) of the chain's GEMMs."""
    co, c = spec.inputs[W].const.shape[:2]
    ws = _input(spec, WS)
    return c, co, spec.inputs[W2].const.shape[0], spec.inputs[R] is not None, 0 if ws is None else ws.const.shape[1]


def supports_wgmma(spec: LayerSpec, device) -> str | None:
    reason = supports_chain(spec, device) or tma_device_reason(device)
    if reason is None and not int8_gemm_chain.available():
        return "this triton has no Gluon"
    if reason is None and _input(spec, XS) is not None and tuple(spec.attrs.get("strides2", (1, 1))) != (1, 1):
        return "a stride-1 shortcut conv only (its rows are the first conv's)"
    if reason is None and any(epilogue(a)[0] not in int8_gemm_chain.wg.ACTIVATIONS
                              for a in (spec.attrs, second_attrs(spec.attrs))):
        return f"activations {', '.join(int8_gemm_chain.wg.ACTIVATIONS)} only"
    if reason is None and not wgmma_configs(spec, device, 3):
        return "no tile fits: K must be 32..128, N a multiple of 64, N2 at most 256, both weights in shared memory"
    return reason


def wgmma_configs(spec: LayerSpec, device, level: int):
    out, (k, n, n2, residual, kx) = spec.outputs[0].shape, _shape(spec)
    return mark_nhwc(int8_gemm_chain.configs(out[0] * out[2] * out[3], k, n, n2, smem_limit(device), residual,
                                             kx))


def compile_wgmma(spec: LayerSpec, config, device):
    a = spec.attrs
    w, scale, bias, w2, scale2, bias2, shortcut = _constants(spec)
    b = second_attrs(a)
    kw = dict(out_scale=a["out_scale"], res_scale=a.get("res_scale"), activation=epilogue(a)[0],
              out2_scale=b["out_scale"], activation2=epilogue(b)[0],
              config={k: config[k] for k in int8_gemm_chain.CONFIG_KEYS})
    n, k, h, wd = spec.inputs[X].shape
    rows = lambda t: t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])  # noqa: E731 (NHWC memory: a view)
    back = lambda t: t.reshape(n, h, wd, -1).permute(0, 3, 1, 2)  # noqa: E731

    def run(inputs, out=None):
        res = rows(inputs[R]) if inputs[R] is not None else None
        short = (rows(inputs[XS]), *shortcut) if shortcut is not None else None
        y, z = int8_gemm_chain.chain(rows(inputs[X]), w, scale, bias, res, w2, scale2, bias2, shortcut=short,
                                     out=out[0] if out else None, out2=out[1] if out else None, **kw)
        return [back(y), back(z)]

    return run


def fits(device):
    """Whether the chain kernel runs convs of (K, N, N2, residual, KX) on `device` two programs to an SM, where the
    build fuses them: on an H100 (2026-11-24) ResNet-50's layer-1 chains ran 54 and 64 µs against 70 and 74 for the
    two GEMMs, its layer-2 chain, one program to an SM (the weights 128 KiB), 56 against 33."""
    smem = smem_limit(device)
    return lambda k, n, n2, residual, kx=0: any(c["stream"] > 1 for c in int8_gemm_chain.configs(
        None, k, n, n2, smem, residual, kx))
