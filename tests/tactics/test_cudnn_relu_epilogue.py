"""cudnn_fused_conv's cuDNN-epilogue config (bias and ReLU inside the conv kernel) for ReLU and for Clip(0, hi) —
ReLU6 — as ReLU then min(·, hi); not for other clips. On a GPU: equal to the reference within fp16 tolerance."""

import pytest
import torch

from kiln.builder.autotune import TOLERANCE
from kiln.ir import DType
from kiln.kinds import run_reference
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from kiln.target.device import Device

CPU = Device("cpu", "cpu", "cpu")


def _spec(activation: str, params: list, dtype=torch.float32, residual=False, device="cpu"):
    g = torch.Generator().manual_seed(0)
    w, b = (torch.randn(8, 4, 3, 3, generator=g).to(device, dtype), torch.randn(8, generator=g).to(device, dtype))
    dt = DType.from_torch(dtype)
    attrs = {"activation": activation, "activation_params": params, "dilations": [1, 1], "group": 1,
             "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1], "residual": int(residual)}
    ins = [ValueSpec(dt, (2, 4, 6, 6)), ValueSpec(dt, (8, 4, 3, 3), w), ValueSpec(dt, (8,), b)]
    if residual:
        ins.append(ValueSpec(dt, (2, 8, 6, 6)))
    return LayerSpec("c", "FusedConv", attrs, tuple(ins), (ValueSpec(dt, (2, 8, 6, 6)),)), w, b


def _offers_cudnn_epilogue(spec) -> bool:
    return any(c.get("epilogue") == "cudnn" for c in registry.get("cudnn_fused_conv").configs(spec, CPU, 2))


@pytest.mark.skipif(not hasattr(torch, "cudnn_convolution_relu"), reason="this torch has no cudnn_convolution_relu")
def test_offered_for_relu_and_relu6_only():
    assert _offers_cudnn_epilogue(_spec("Relu", [])[0])
    assert _offers_cudnn_epilogue(_spec("Clip", [0.0, 6.0])[0])
    assert _offers_cudnn_epilogue(_spec("Clip", [0.0, None])[0])
    assert not _offers_cudnn_epilogue(_spec("Clip", [-1.0, 6.0])[0])
    assert not _offers_cudnn_epilogue(_spec("Sigmoid", [])[0])


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True])
def test_gpu_relu6_epilogue_matches_reference(residual):
    from kiln.target.device import detect

    gpu = detect("cuda")
    spec, w, b = _spec("Clip", [0.0, 6.0], torch.float16, residual, "cuda")
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 4, 6, 6, generator=g) * 3).half().cuda()
    r = torch.randn(2, 8, 6, 6, generator=g).half().cuda()
    ins = [x, w, b] + ([r] if residual else [])
    want = run_reference("FusedConv", [t.float().cpu() for t in ins], spec.attrs)[0]
    tactic = registry.get("cudnn_fused_conv")
    configs = [c for c in tactic.configs(spec, gpu, 2) if c.get("epilogue")]
    assert configs
    for config in configs:
        got = tactic.compile(spec, config, gpu)(ins)[0]
        rtol, atol = TOLERANCE[torch.float16]
        assert torch.allclose(got.float().cpu(), want, rtol=rtol, atol=atol), config
        assert float(got.max()) <= 6.0 and float(got.min()) >= 0.0
