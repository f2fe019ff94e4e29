"""triton_separable_conv (a depthwise conv and the 1x1 conv that reads it, one kernel) against the SeparableConv
reference, which composes the two FusedConv references.

On the CPU the kernel runs under TRITON_INTERPRET=1 at tiny shapes; the gpu test runs MobileNetV2's batch-1 shapes.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.ir import DType  # noqa: E402
from kiln.kernels import separable_conv  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402
from kiln.target.device import Device  # noqa: E402

from test_kernels_conv import _check  # noqa: E402  (the Conv tests' tolerance check)

CPU = Device("cpu", "cpu", "cpu")
TACTIC = registry.get("triton_separable_conv")
SMALL = {"layout": "nhwc", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 2}
CONSTANT = (1, 2, 3, 4)  # Wd, Bd, Wp, Bp


def _attrs(c, k=3, stride=1, pads=(1, 1, 1, 1), dilation=1, act=("Clip", [0.0, 6.0]), pw_act=("none", []),
           residual=False):
    return {"kernel_shape": [k, k], "strides": [stride, stride], "dilations": [dilation, dilation],
            "pads": list(pads), "group": c, "auto_pad": "NOTSET", "activation": act[0], "activation_params": act[1],
            "pw_activation": pw_act[0], "pw_activation_params": pw_act[1], "residual": residual}


def _spec(attrs, inputs):
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape),
                                                  t if i in CONSTANT else None) for i, t in enumerate(inputs))
    want = run_reference("SeparableConv", inputs, attrs)[0]
    return LayerSpec("sep", "SeparableConv", attrs, vals, (ValueSpec(DType.from_torch(want.dtype),
                                                                        tuple(want.shape)),)), want


def _inputs(n, c, co, hw, k=3, stride=1, pad=1, dilation=1, residual=False, bias=True, dtype=torch.float32,
            device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    oh = (hw[0] + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    ow = (hw[1] + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    t = [torch.randn(n, c, *hw, generator=g), torch.randn(c, 1, k, k, generator=g) * 0.5,
         torch.randn(c, generator=g) if bias else None, torch.randn(co, c, 1, 1, generator=g) / c ** 0.5,
         torch.randn(co, generator=g) if bias else None]
    if residual:
        t.append(torch.randn(n, co, oh, ow, generator=g))
    return [None if v is None else v.to(dtype).to(device) for v in t]


@pytest.mark.parametrize("k, stride, pad, dilation", [(3, 1, 1, 1), (3, 2, 1, 1), (3, 1, 2, 2), (5, 2, 2, 1)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_reference(k, stride, pad, dilation, channels_last):
    """Strides, dilation and a 5x5 on NCHW and channels_last inputs; 20 depthwise channels cut the 16-channel
    blocks, 24 outputs the 16-wide output blocks, the pixels the 16-pixel tiles."""
    inputs = _inputs(2, 20, 24, (7, 9), k, stride, pad, dilation)
    if channels_last:
        inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)
    spec, want = _spec(_attrs(20, k, stride, (pad,) * 4, dilation), inputs)
    assert TACTIC.supports(spec, CPU) is None
    assert all(cfg["layout"] == "nhwc" for cfg in TACTIC.configs(spec, CPU, 4))
    _check(TACTIC.compile(spec, SMALL, CPU)(inputs)[0], want)


@pytest.mark.parametrize("act, pw_act, residual, bias", [
    (("Clip", [0.0, 6.0]), ("none", []), True, True), (("Relu", []), ("HardSwish", []), False, True),
    (("none", []), ("Clip", [None, 1.0]), True, False), (("Sigmoid", []), ("Relu", []), False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_activations_residual_and_dtypes(act, pw_act, residual, bias, dtype):
    """Both activations (the depthwise one also on the padded channels past C, which must add nothing: Sigmoid
    makes 0.5 of them), residual, no biases, in each float dtype."""
    inputs = _inputs(1, 24, 16, (6, 5), residual=residual, bias=bias, dtype=dtype, seed=3)
    spec, want = _spec(_attrs(24, act=act, pw_act=pw_act, residual=residual), inputs)
    assert TACTIC.supports(spec, CPU) is None
    config = dict(SMALL, BLOCK_K=32)  # 24 channels in a 32-wide block: eight padded ones
    _check(TACTIC.compile(spec, config, CPU)(inputs)[0], want)


def test_every_config_offered_at_level_4():
    inputs = _inputs(1, 48, 40, (8, 8), dtype=torch.float16, seed=5)
    spec, want = _spec(_attrs(48), inputs)
    configs = TACTIC.configs(spec, CPU, 4)
    assert len(configs) > len(TACTIC.configs(spec, CPU, 3)) >= 2
    for config in configs:
        _check(TACTIC.compile(spec, config, CPU)(inputs)[0], want)


@pytest.mark.parametrize("split", [2, 3])
def test_channel_blocks_split_across_programs(split):
    """SPLIT_K: one 16-pixel tile (under the interpreter's two "multiprocessors") whose 40 channels are three
    16-channel blocks, in 2 or 3 runs summed by the tile's last; a second call reuses the counts it reset."""
    inputs = _inputs(1, 40, 16, (4, 4), residual=True, seed=7)
    spec, want = _spec(_attrs(40, residual=True), inputs)
    kernel = TACTIC.compile(spec, dict(SMALL, SPLIT_K=split), CPU)
    _check(kernel(inputs)[0], want)
    _check(kernel(inputs)[0], want)


def test_split_configs_where_the_grid_underfills():
    """MobileNetV2's last block at batch 1 (49 pixels, 960 → 320 channels) fills few of 132 multiprocessors: its
    first configs split the channels, one block a program first; a large map gets none."""
    late = separable_conv.configs(49, 960, 320, 3, 132)
    assert late[0]["SPLIT_K"] == 15 and late[1]["SPLIT_K"] == 8 and "SPLIT_K" not in late[2]
    assert not any("SPLIT_K" in cfg for cfg in separable_conv.configs(112 * 112, 32, 16, 4, 132))


def test_out_buffer_is_written():
    """writes_out: the output lands in the arena bytes it is given."""
    inputs = _inputs(1, 16, 16, (4, 4))
    spec, want = _spec(_attrs(16), inputs)
    out = torch.empty(want.numel() * 4, dtype=torch.uint8)
    got = TACTIC.compile(spec, SMALL, CPU)(inputs, [out])[0]
    assert got.data_ptr() == out.data_ptr()
    _check(got, want)


def test_refusals():
    inputs = _inputs(1, 16, 16, (4, 4))
    spec, _ = _spec(_attrs(16, pw_act=("Softplus", [])) | {"pw_activation": "Softplus"}, inputs[:3] + inputs[3:])
    assert "Softplus" in TACTIC.supports(spec, CPU)
    with pytest.raises(ValueError, match="activation"):
        separable_conv.separable_conv2d(inputs[0], *separable_conv.pack_weights(inputs[1], inputs[3]), (3, 3),
                                        (1, 1), (1, 1, 1, 1), (1, 1), act2=("softplus", 1.0, 0.0))


@pytest.mark.gpu
@pytest.mark.parametrize("c, co, hw, stride", [(32, 16, 112, 1), (96, 24, 112, 2), (144, 24, 56, 1),
                                               (576, 96, 14, 1), (960, 320, 7, 1)])
def test_gpu_mobilenet_shapes_every_config(c, co, hw, stride):
    """MobileNetV2's depthwise + project pairs at batch 1 in fp16, channels_last, ReLU6, every config of level 4."""
    inputs = _inputs(1, c, co, (hw, hw), stride=stride, dtype=torch.float16, device="cuda", seed=c)
    inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)
    spec, want = _spec(_attrs(c, stride=stride), inputs)
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    assert TACTIC.supports(spec, dev) is None
    for config in TACTIC.configs(spec, dev, 4):
        _check(TACTIC.compile(spec, config, dev)(inputs)[0], want)
