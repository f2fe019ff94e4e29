"""A 1x1 convolution (stride 1, no padding, one group) in fp16 / bf16 as the TMA-fed Triton GEMM over its NHWC rows:
[N·H·W, C] × [C, CO] with bias, residual and activation in the epilogue, tiles sized to the short reduction
(`gemm_tma.short_k_configs`). MobileNetV2's expand convs write six times the bytes they read; cuDNN and cuBLAS ran
them at 4-9x those bytes' time on an H200, this GEMM at 1.7-2.8x (gpu_pointwise_probe, 2026-11-29)."""

from __future__ import annotations

from kiln.kernels import gemm_tma
from kiln.kernels.common import FEW_ROWS, smem_limit
from kiln.tactics.common import first
from kiln.tactics.int8_common import tma_device_reason
from kiln.tactics.registry import Tactic, register
from kiln.tactics.spec import LayerSpec
from kiln.tactics.triton_common import act_kwargs, conv_reason, conv_rows, mark_nhwc
from kiln.tactics.triton_gemm_tma import HALF

# multiply-adds under which a 1x1 conv is left to the implicit-GEMM conv's small tiles: of the batch-1 1x1 convs of
# ResNet-50 (51M at most) and MobileNetV2 (20M) it won one in one build and none in the others, every MobileNetV2
# batch-64 one it won had 200M or more, and its compiles were a fifth of MobileNetV2's batch-1 compile thread-seconds
# (H200, stops 51-52)
MIN_MACS = 1 << 26


def _supports(spec: LayerSpec, device) -> str | None:
    reason = conv_reason(spec, device)
    if reason:
        return reason
    a, w = spec.attrs, spec.inputs[1].const
    if (list(a["kernel_shape"]) != [1, 1] or list(a["strides"]) != [1, 1] or any(a["pads"])
            or a.get("group", 1) != 1):
        return "only 1x1 convolutions of stride 1, no padding, one group"
    if spec.outputs[0].dtype not in HALF:
        return "fp16 / bf16 only (TMA tiles of 2-byte values)"
    if not gemm_tma.addressable(w.shape[0], w.shape[1]):
        return "input and output channels must be multiples of 8 (TMA's 16-byte rows)"
    pixels = conv_rows(spec.outputs[0].shape)
    if pixels is not None and pixels * w.shape[0] * w.shape[1] < MIN_MACS:
        return f"under {MIN_MACS >> 20}M multiply-adds (latency-bound: the implicit-GEMM conv's small tiles serve it)"
    return tma_device_reason(device)


def _configs(spec: LayerSpec, device, level: int):
    co, c = spec.inputs[1].const.shape[:2]
    out = mark_nhwc(gemm_tma.short_k_configs(co, c, smem_limit(device)))
    pixels = conv_rows(spec.outputs[0].shape)  # few (a late layer at batch 64): two tiles
    return out[:{0: 1, 1: 2, 2: 4}.get(level, 2 if pixels is not None and pixels < FEW_ROWS else len(out))]


def _compile(spec: LayerSpec, config, device):
    weight = spec.inputs[1].const
    co = weight.shape[0]
    w = weight.reshape(co, -1).contiguous()  # [CO, C]: the GEMM's [N, K]
    kw = act_kwargs(spec.attrs) if spec.kind == "FusedConv" else {}
    tiles = {k: v for k, v in config.items() if k != "layout"}

    def run(inputs, out=None):
        x, _, bias, residual = (list(inputs) + [None] * 4)[:4]
        n, c, h, wd = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(-1, c)  # a view for channels_last input, else one copy
        res = None if residual is None else residual.permute(0, 2, 3, 1).reshape(-1, co)
        y = gemm_tma.matmul(rows, w, bias, config=tiles, residual=res, out=first(out), **kw)
        return [y.view(n, h, wd, co).permute(0, 3, 1, 2)]

    return run


register(Tactic("triton_tma_conv1x1", ("Conv", "FusedConv"), _compile, _supports, _configs, priority=25,
                arch_specific=True, writes_out=True))
