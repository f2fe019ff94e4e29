"""Triton implicit-GEMM convolution and the triton_conv tactic against the Conv / FusedConv references.

On the CPU the kernel runs under TRITON_INTERPRET=1 at tiny shapes; the gpu tests run ResNet-sized ones.
Tolerances: fp32 1e-4 (fp32 accumulation, another summation order over up to 3·3·C terms); fp16 the autotuner's.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.builder.autotune import TOLERANCE  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.ir import DType  # noqa: E402
from kiln.kernels import conv  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402

CPU = Device("cpu", "cpu", "cpu")
SMALL = {"layout": "nhwc", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 2, "num_stages": 2}
TOL = {**TOLERANCE, torch.float32: (1e-4, 1e-4)}


def _attrs(k=3, stride=1, pads=(1, 1, 1, 1), dilation=1, **extra):
    return {"kernel_shape": [k, k], "strides": [stride, stride], "dilations": [dilation, dilation],
            "pads": list(pads), "group": 1, "auto_pad": "NOTSET", **extra}


def _spec(kind, attrs, inputs):
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape), t if i in (1, 2) else None)
                 for i, t in enumerate(inputs))
    want = run_reference(kind, inputs, attrs)
    outs = tuple(ValueSpec(DType.from_torch(w.dtype), tuple(w.shape)) for w in want)
    return LayerSpec("conv", kind, attrs, vals, outs), want[0]


def _check(got, want):
    rtol, atol = TOL[want.dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("k, stride, pads, dilation", [(3, 1, (1, 1, 1, 1), 1), (3, 2, (0, 1, 2, 0), 1),
                                                        (1, 1, (0, 0, 0, 0), 1), (3, 1, (2, 2, 2, 2), 2),
                                                        (5, 3, (1, 2, 1, 2), 1)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_tactic_matches_reference(k, stride, pads, dilation, channels_last):
    """Strides, asymmetric pads, dilation and 1x1, on NCHW and channels_last inputs; edges cut every tile."""
    g = torch.Generator().manual_seed(k * 10 + stride)
    x = torch.randn(2, 5, 9, 11, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    inputs = [x, torch.randn(18, 5, k, k, generator=g), torch.randn(18, generator=g)]
    spec, want = _spec("Conv", _attrs(k, stride, pads, dilation), inputs)
    tactic = registry.get("triton_conv")
    assert tactic.supports(spec, CPU) is None
    _check(tactic.compile(spec, SMALL, CPU)(inputs)[0], want)


@pytest.mark.parametrize("act, params", [("Relu", []), ("Clip", [0.0, 6.0]), ("SiLU", []), ("none", [])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_conv_with_residual_and_activation(act, params, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 20, 6, 7, generator=g).to(dtype)
    w, b = torch.randn(24, 20, 3, 3, generator=g).to(dtype) * 0.2, torch.randn(24, generator=g).to(dtype)
    r = torch.randn(1, 24, 6, 7, generator=g).to(dtype)
    attrs = _attrs(residual=True, activation=act, activation_params=params)
    spec, want = _spec("FusedConv", attrs, [x, w, b, r])
    tactic = registry.get("triton_conv")
    assert tactic.supports(spec, CPU) is None
    assert all(c["layout"] == "nhwc" for c in tactic.configs(spec, CPU, 3))
    _check(tactic.compile(spec, SMALL, CPU)([x, w, b, r])[0], want)


def test_conv_without_bias_and_default_config():
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    want = torch.nn.functional.conv2d(x, w, padding=1)
    got = conv.conv2d(x, conv.pack_weight(w), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    _check(got, want)


def test_supports_reasons():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 2, 3, 3)
    spec, _ = _spec("Conv", _attrs(group=2), [x, w])
    assert "grouped" in registry.get("triton_conv").supports(spec, CPU)
    spec, _ = _spec("Conv", {**_attrs(k=3), "kernel_shape": [3], "strides": [1], "dilations": [1], "pads": [1, 1]},
                    [torch.randn(1, 4, 6), torch.randn(4, 4, 3)])
    assert "2-D" in registry.get("triton_conv").supports(spec, CPU)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, k, stride", [((1, 64, 56, 56), 3, 1), ((8, 256, 14, 14), 1, 1),
                                               ((8, 128, 28, 28), 3, 2), ((1, 3, 224, 224), 7, 2)])
def test_gpu_resnet_shapes_every_config(shape, k, stride):
    """ResNet-50's conv shapes in fp16, channels_last, every config the tactic offers at level 3."""
    x = torch.randn(shape, device="cuda").half().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(64, shape[1], k, k, device="cuda") * 0.05).half()
    b = torch.randn(64, device="cuda").half()
    p = k // 2
    spec, want = _spec("FusedConv", _attrs(k, stride, (p, p, p, p), activation="Relu", activation_params=[],
                                           residual=False), [x, w, b])
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    tactic = registry.get("triton_conv")
    for config in tactic.configs(spec, dev, 3):
        _check(tactic.compile(spec, config, dev)([x, w, b])[0], want)
