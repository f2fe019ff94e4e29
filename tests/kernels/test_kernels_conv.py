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
from kiln.kernels import common  # noqa: E402
from kiln.kernels.common import step_slice  # noqa: E402
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


@pytest.mark.parametrize("split", [2, 3, 4])
def test_split_k_matches_reference_and_resets_its_counts(split, monkeypatch):
    """Split-K over the 3·3·3 (tap, channel block) steps (a split ending mid-tap at 2 and 4; 40 channels: a ragged
    last block) with bias, residual and ReLU: the same answer on every call, so each tile's count is back at zero
    after its last split."""
    monkeypatch.setattr(common, "sm_count", lambda device: 132)  # the interpreter's 2 would call 4 tiles a full GPU
    g = torch.Generator().manual_seed(split)
    x = torch.randn(1, 40, 5, 6, generator=g)
    w, b, r = torch.randn(24, 40, 3, 3, generator=g) * 0.2, torch.randn(24, generator=g), torch.randn(1, 24, 5, 6)
    attrs = _attrs(residual=True, activation="Relu", activation_params=[])
    spec, want = _spec("FusedConv", attrs, [x, w, b, r])
    run = registry.get("triton_conv").compile(spec, SMALL | {"SPLIT_K": split}, CPU)
    for _ in range(2):
        _check(run([x, w, b, r])[0], want)
    scratch = conv.SplitScratch()
    for _ in range(2):
        _check(conv.conv2d(x, conv.pack_weight(w), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), b, r, activation="relu",
                           config=SMALL | {"SPLIT_K": split}, scratch=scratch), want)
    (ws, counts), = scratch._sets.values()
    assert counts.tolist() == [0] * 4 and ws.numel() == step_slice(27, split)[1] * 4 * 16 * 16


def test_split_k_without_scratch_or_on_a_full_grid_runs_unsplit(monkeypatch):
    monkeypatch.setattr(common, "sm_count", lambda device: 4)
    x, w = torch.randn(1, 32, 8, 8), torch.randn(8, 32, 1, 1)  # 4 tiles of 16 pixels: the "GPU" is full
    scratch = conv.SplitScratch()
    got = conv.conv2d(x, conv.pack_weight(w), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), config=SMALL | {"SPLIT_K": 2},
                      scratch=scratch)
    _check(got, torch.nn.functional.conv2d(x, w))
    assert not scratch._sets
    x, w = torch.randn(1, 32, 4, 4), torch.randn(8, 32, 1, 1)
    want = torch.nn.functional.conv2d(x, w)
    got = conv.conv2d(x, conv.pack_weight(w), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), config=SMALL | {"SPLIT_K": 2})
    _check(got, want)


def test_split_configs_only_for_grids_that_underfill():
    """ResNet-50's last 3x3 conv at batch 1 (49 pixels, 512 channels) gets split-K configs filling about 132
    multiprocessors; the same conv at batch 64 does not, nor any at level 1."""
    late = conv.configs(49, 512, 512, 2, 228 * 1024, 3, sms=132, taps=9)
    split = [c for c in late if "SPLIT_K" in c]
    assert split and all(c["BLOCK_M"] <= 64 for c in split)
    assert any(66 < 512 // c["BLOCK_N"] * c["SPLIT_K"] <= 264 for c in split)
    assert all(2 * c["SPLIT_K"] <= 9 * 512 // c["BLOCK_K"] for c in split)  # two steps a split at least
    assert not any("SPLIT_K" in c for c in conv.configs(49 * 64, 512, 512, 2, 228 * 1024, 3, sms=132))
    assert not any("SPLIT_K" in c for c in conv.configs(49, 512, 512, 2, 228 * 1024, 1, sms=132))
    assert not any("SPLIT_K" in c for c in conv.configs(None, 512, 512, 2, 228 * 1024, 3, sms=132))  # rows unknown
    # a reduction under MIN_SPLIT_REDUCTION (layer4's 512 → 2048 1x1 conv, K = 512) is not split
    assert not any("SPLIT_K" in c for c in conv.configs(49, 2048, 512, 2, 228 * 1024, 3, sms=132, taps=1))


def test_step_slice():
    assert step_slice(144, 16) == (9, 16)
    assert step_slice(27, 2) == (14, 2)   # 14 + 13 steps
    assert step_slice(9, 4) == (3, 3)    # never an empty split


@pytest.mark.gpu
@pytest.mark.parametrize("shape, co, k", [((1, 512, 7, 7), 512, 3), ((1, 256, 14, 14), 256, 3),
                                           ((1, 2048, 7, 7), 512, 1), ((1, 1024, 14, 14), 256, 1)])
def test_gpu_split_k_resnet_batch1_every_config(shape, co, k):
    """ResNet-50's late convs at batch 1 in fp16 with a residual: every config at level 3 (split-K among them),
    three calls each, on the GPU's real atomics."""
    x = torch.randn(shape, device="cuda").half().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(co, shape[1], k, k, device="cuda") * 0.02).half()
    b = torch.randn(co, device="cuda").half()
    r = torch.randn(1, co, 7 if shape[2] == 7 else 14, shape[3], device="cuda").half()
    p = k // 2
    spec, want = _spec("FusedConv", _attrs(k, 1, (p, p, p, p), activation="Relu", activation_params=[],
                                           residual=True), [x, w, b, r])
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    tactic = registry.get("triton_conv")
    configs = tactic.configs(spec, dev, 3)
    assert any("SPLIT_K" in c for c in configs)
    for config in configs:
        run = tactic.compile(spec, config, dev)
        for _ in range(3):
            _check(run([x, w, b, r])[0], want)


@pytest.mark.parametrize("k, pads, c", [(7, (3, 3, 3, 3), 3), (3, (1, 1, 1, 1), 4), (5, (2, 1, 1, 2), 1)])
def test_s2d_stem_conv_matches_reference(k, pads, c):
    """triton_conv_s2d: a stride-2 stem (7x7 on 3 channels as ResNet's, odd sizes, asymmetric pads) as
    space-to-depth + the stride-1 implicit-GEMM conv, with bias, residual and ReLU; it refuses stride 1 and
    more than 4 channels."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(2, c, 19, 17, generator=g)
    w, b = torch.randn(8, c, k, k, generator=g) * 0.2, torch.randn(8, generator=g)
    out = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (pads[1], pads[3], pads[0], pads[2])), w, stride=2)
    r = torch.randn(out.shape, generator=g)
    attrs = _attrs(k, 2, pads, residual=True, activation="Relu", activation_params=[])
    spec, want = _spec("FusedConv", attrs, [x, w, b, r])
    tactic = registry.get("triton_conv_s2d")
    assert tactic.supports(spec, CPU) is None
    _check(tactic.compile(spec, SMALL, CPU)([x, w, b, r])[0], want)
    spec1, _ = _spec("Conv", _attrs(k, 1, pads), [x, w])
    assert "stride 2" in tactic.supports(spec1, CPU)
    wide = torch.randn(8, 5, k, k)
    spec5, _ = _spec("Conv", _attrs(k, 2, pads), [torch.randn(1, 5, 19, 17), wide])
    assert "input channels" in tactic.supports(spec5, CPU)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_gpu_s2d_stem_resnet_every_config(batch):
    """ResNet-50's stem (7x7 / 2 on 3 channels at 224²) through triton_conv_s2d in fp16, every level-3 config."""
    x = torch.randn(batch, 3, 224, 224, device="cuda").half()
    w, b = (torch.randn(64, 3, 7, 7, device="cuda") * 0.05).half(), torch.randn(64, device="cuda").half()
    spec, want = _spec("FusedConv", _attrs(7, 2, (3, 3, 3, 3), activation="Relu", activation_params=[],
                                           residual=False), [x, w, b])
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    tactic = registry.get("triton_conv_s2d")
    assert tactic.supports(spec, dev) is None
    for config in tactic.configs(spec, dev, 3):
        _check(tactic.compile(spec, config, dev)([x, w, b])[0], want)
