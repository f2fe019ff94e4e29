"""triton_tma_conv1x1: a 1x1 conv as the TMA-fed GEMM over its NHWC rows, against the Conv / FusedConv references.

On the CPU the kernel runs under TRITON_INTERPRET=1 at tiny shapes; the gpu test runs MobileNetV2's 1x1 shapes."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.kernels import gemm_tma  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from tests.kernels.test_kernels_conv import _check, _spec  # noqa: E402

CPU = Device("cpu", "cpu", "cpu")
TACTIC = registry.get("triton_tma_conv1x1")
TINY = {"layout": "nhwc", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4,
        "num_stages": 2}
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _any_size(monkeypatch, request):
    """The CPU tests run tiny convs, far under MIN_MACS; the size rule has its own test."""
    if request.node.name != "test_small_convs_left_to_the_implicit_gemm":
        monkeypatch.setattr("kiln.tactics.triton_tma_conv1x1.MIN_MACS", 0)


def _attrs(**extra):
    return {"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1,
            "auto_pad": "NOTSET", **extra}


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("residual, act, params", [(False, "Clip", [0.0, 6.0]), (True, "none", []),
                                                   (True, "Relu", [])])
@pytest.mark.parametrize("persistent", [False, True])
def test_matches_reference(channels_last, residual, act, params, persistent):
    """24 → 40 channels over 5x7 pixels (rows and channels cut the 16-wide tiles), bias, a residual added before
    the activation; a plain NCHW input is copied to rows first."""
    g = torch.Generator().manual_seed(int(residual) * 2 + int(channels_last))
    x = torch.randn(2, 24, 5, 7, generator=g).half()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    inputs = [x, (torch.randn(40, 24, 1, 1, generator=g) * 0.3).half(), torch.randn(40, generator=g).half()]
    if residual:
        inputs.append(torch.randn(2, 40, 5, 7, generator=g).half().contiguous(memory_format=torch.channels_last))
    spec, want = _spec("FusedConv", _attrs(residual=residual, activation=act, activation_params=params), inputs)
    assert TACTIC.supports(spec, CPU) is None
    _check(TACTIC.compile(spec, dict(TINY, persistent=persistent), CPU)(inputs)[0], want)


def test_plain_conv_writes_out():
    """A Conv without bias writes into the planned buffer, NHWC."""
    x = torch.randn(1, 16, 4, 4).half().contiguous(memory_format=torch.channels_last)
    inputs = [x, torch.randn(32, 16, 1, 1).half()]
    spec, want = _spec("Conv", _attrs(), inputs)
    buf = torch.empty(32 * 16 * 2, dtype=torch.uint8)
    got = TACTIC.compile(spec, TINY, CPU)(inputs, out=[buf])[0]
    assert got.data_ptr() == buf.data_ptr()
    _check(got, want)


def test_supports_reasons():
    """3x3, strided, grouped, fp32 and channels off TMA's 16-byte rows are refused, each with its reason."""
    x, w = torch.randn(1, 16, 6, 6).half(), torch.randn(32, 16, 1, 1).half()
    assert "1x1" in TACTIC.supports(_spec("Conv", dict(_attrs(), kernel_shape=[3, 3], pads=[1] * 4),
                                          [x, torch.randn(32, 16, 3, 3).half()])[0], CPU)
    assert "1x1" in TACTIC.supports(_spec("Conv", dict(_attrs(), strides=[2, 2]), [x, w])[0], CPU)
    assert "1x1" in TACTIC.supports(_spec("Conv", dict(_attrs(), group=2), [x, torch.randn(32, 8, 1, 1).half()])[0],
                                    CPU)
    assert "fp16" in TACTIC.supports(_spec("Conv", _attrs(), [x.float(), w.float()])[0], CPU)
    assert "multiples of 8" in TACTIC.supports(_spec("Conv", _attrs(), [x[:, :12], w[:, :12]])[0], CPU)


def test_small_convs_left_to_the_implicit_gemm():
    """Under MIN_MACS multiply-adds (every batch-1 1x1 conv of ResNet-50 and MobileNetV2) the tactic refuses; a
    batch-64 MobileNetV2 expand (12,544 pixels x 64 x 384) and a conv of unknown size are taken."""
    def reason(n, c, co, side):
        return TACTIC.supports(_spec("Conv", _attrs(), [torch.empty(n, c, side, side).half(),
                                                        torch.randn(co, c, 1, 1).half()])[0], CPU)

    assert "multiply-adds" in reason(1, 64, 256, 56)  # ResNet-50 layer1, batch 1: 51M
    assert "multiply-adds" in reason(1, 320, 1280, 7)
    assert reason(64, 64, 384, 14) is None


def test_short_k_configs(monkeypatch):
    """BLOCK_K covers the reduction (up to 64), BLOCK_N the output width (up to 256); every tile fits shared memory
    and keeps at most 128 fp32 accumulators a thread; level 0 offers one."""
    many = gemm_tma.short_k_configs(96, 16, 227 * 1024)
    assert {c["BLOCK_K"] for c in many} == {16} and max(c["BLOCK_N"] for c in many) == 128
    wide = gemm_tma.short_k_configs(1280, 320, 227 * 1024)
    assert {c["BLOCK_K"] for c in wide} == {64} and max(c["BLOCK_N"] for c in wide) == 256
    for c in many + wide:
        assert gemm_tma.smem_bytes(c) <= 227 * 1024
        assert c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"]) <= 128
    assert len(gemm_tma.short_k_configs(1280, 320, 99 * 1024)) < len(wide)
    spec, _ = _spec("Conv", _attrs(), [torch.randn(1, 16, 4, 4).half(), torch.randn(96, 16, 1, 1).half()])
    assert len(TACTIC.configs(spec, CPU, 0)) == 1 and all(c["layout"] == "nhwc" for c in TACTIC.configs(spec, CPU, 4))
    monkeypatch.setattr("kiln.tactics.triton_tma_conv1x1.smem_limit", lambda device: 227 * 1024)  # an H100's
    assert len(TACTIC.configs(spec, CPU, 3)) == 2  # 16 output pixels: few rows, two tiles
    big = torch.empty(64, 16, 56, 56).half()
    spec, _ = _spec("Conv", _attrs(), [big, torch.randn(96, 16, 1, 1).half()])
    assert len(TACTIC.configs(spec, CPU, 3)) == len(many) > 2


@pytest.mark.gpu
@pytest.mark.parametrize("c, co, side, residual", [(16, 96, 112, False), (144, 24, 56, True), (320, 1280, 7, False)])
def test_gpu_mobilenet_shapes_every_config(c, co, side, residual):
    """MobileNetV2's 1x1 convs at batch 8 in fp16 (an expand, a projection with its skip, the last conv), ReLU6 or
    none, every config at level 4."""
    x = torch.randn(8, c, side, side, device="cuda").half().contiguous(memory_format=torch.channels_last)
    inputs = [x, (torch.randn(co, c, 1, 1, device="cuda") / c ** 0.5).half(), torch.randn(co, device="cuda").half()]
    if residual:
        inputs.append(torch.randn(8, co, side, side, device="cuda").half().contiguous(
            memory_format=torch.channels_last))
    act = {"activation": "none", "activation_params": []} if residual else {"activation": "Clip",
                                                                           "activation_params": [0.0, 6.0]}
    spec, want = _spec("FusedConv", _attrs(residual=residual, **act), inputs)
    device = Device("cuda", torch.cuda.get_device_name(0), "cuda")
    assert TACTIC.supports(spec, device) is None
    for config in TACTIC.configs(spec, device, 4):
        _check(TACTIC.compile(spec, config, device)(inputs)[0], want)
