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
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kiln.kernels import pointwise  # noqa: E402
from kiln.kernels.common import erf  # noqa: E402
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


@triton.jit
def _erf_kernel(x, y, n, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + r, erf(tl.load(x + r, mask=r < n)), mask=r < n)


def test_fast_erf_is_within_5e_7_of_erf_and_exactly_one_beyond_its_clamp():
    """kernels/common.erf (the rational fit that GELU epilogues use) against torch's erf in float64."""
    x = torch.cat([torch.linspace(-6, 6, 20001), torch.tensor([-30.0, -3.92, 3.92, 1e30, -1e-30, 0.0])])
    y = torch.empty_like(x)
    _erf_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    assert (y.double() - torch.erf(x.double())).abs().max() < 5e-7  # 3.6e-7 with fused multiply-adds
    assert y[-6:-3].tolist() == [-1.0, -1.0, 1.0] and y[-3] == 1.0 and y[-1] == 0.0


def test_fast_erf_constants_are_the_fit():
    """The constants in kernels/common.py are what benchmarks/probes/fit_erf.py fits (to fp32)."""
    import numpy as np

    from benchmarks.probes import fit_erf
    from kiln.kernels import common

    p, q = fit_erf.fit()
    want = [np.float32(c / fit_erf.CLAMP ** (2 * i)) for i, c in enumerate(p)] + \
        [np.float32(c / fit_erf.CLAMP ** (2 * i)) for i, c in enumerate(q)][1:]
    got = [getattr(common, f"ERF_P{i}").value for i in range(6)] + [getattr(common, f"ERF_Q{i}").value
                                                                     for i in range(1, 6)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert common.ERF_CLAMP.value == fit_erf.CLAMP
