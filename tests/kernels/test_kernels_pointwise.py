"""The Triton pointwise activation kernel and the triton_pointwise tactic against each activation's reference.

Tolerances: fp32 1e-5 relative with 1e-6 absolute (tanh / sigmoid through exp differ by a few ulps near 0);
fp16 / bf16 the autotuner's (the reference may compute in the half type, the kernel in fp32).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.builder.autotune import TOLERANCE  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.ir import DType  # noqa: E402
from kiln.kernels import pointwise  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402

TOL = {**TOLERANCE, torch.float32: (1e-5, 1e-6)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CPU = Device("cpu", "cpu", "cpu")
CASES = [("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {}), ("Gelu", {"approximate": "none"}),
         ("Gelu", {"approximate": "tanh"}), ("Swish", {"alpha": 1.5}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
         ("HardSwish", {}), ("Softsign", {}), ("Elu", {"alpha": 0.7})]


def _spec(kind, attrs, x):
    want = run_reference(kind, [x], attrs)
    v = ValueSpec(DType.from_torch(x.dtype), tuple(x.shape))
    return LayerSpec("l", kind, attrs, (v,), (v,)), want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,attrs", CASES)
def test_tactic(kind, attrs, dtype):
    """Every op of the table, on a tensor that ends mid-block, through the tactic's compiled kernel."""
    x = (torch.randn(3, 7, 61, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    x[0, 0, :4] = torch.tensor([0.0, 1e-4, -30.0, 30.0])
    spec, want = _spec(kind, attrs, x)
    tactic = registry.get("triton_pointwise")
    assert tactic.supports(spec, CPU) is None
    got = tactic.compile(spec, tactic.configs(spec, CPU, 0)[0], CPU)([x])[0]
    rtol, atol = TOL[dtype]
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), want[0].float(), rtol=rtol, atol=atol)


def test_non_contiguous_input_and_every_config():
    x = torch.randn(40, 50).t()
    for config in pointwise.CONFIGS:
        torch.testing.assert_close(pointwise.apply(x, "relu", config=config), torch.relu(x))


def test_supports_only_floats():
    spec, _ = _spec("Relu", {}, torch.arange(6, dtype=torch.int32))
    assert "float" in registry.get("triton_pointwise").supports(spec, CPU)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,attrs", CASES)
def test_gpu_every_config(kind, attrs, dtype):
    x = (torch.randn(64, 128, 768, device="cuda") * 4).to(dtype)
    spec, want = _spec(kind, attrs, x)
    tactic, device = registry.get("triton_pointwise"), Device("cuda", torch.cuda.get_device_name(0), "cuda")
    rtol, atol = TOL[dtype]
    for config in tactic.configs(spec, device, 5):
        torch.testing.assert_close(tactic.compile(spec, config, device)([x])[0].float(), want[0].float(),
                                   rtol=rtol, atol=atol)
