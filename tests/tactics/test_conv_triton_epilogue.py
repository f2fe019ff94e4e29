"""cudnn_fused_conv's Triton-epilogue config: cuDNN's conv without its bias, then bias + residual + activation in
one in-place pass (kernels/pointwise.bias_act_), in NCHW and NHWC memory; offered for 2-D convs only. Checked
against the FusedConv reference (on the CPU through the Triton interpreter)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.kernels import pointwise  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.target.device import Device  # noqa: E402

from test_cudnn_relu_epilogue import _spec  # noqa: E402

CPU = Device("cpu", "cpu", "cpu")
ACTS = [("none", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.1]), ("Clip", [None, 0.5])]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("activation,params", ACTS)
def test_matches_reference(layout, residual, activation, params):
    spec, w, b = _spec(activation, params, residual=residual)
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(2, 4, 6, 6, generator=g) * 3, torch.randn(2, 8, 6, 6, generator=g)
    ins = [x, w, b] + ([r] if residual else [])
    want = run_reference("FusedConv", ins, spec.attrs)[0]
    tactic = registry.get("cudnn_fused_conv")
    config = {"layout": layout, "epilogue": "triton"}
    assert config in tactic.configs(spec, CPU, 2)
    got = tactic.compile(spec, config, CPU)(ins)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=torch.channels_last if layout == "nhwc" else torch.contiguous_format)


def test_not_offered_for_1d_convs():
    spec, _, _ = _spec("Relu", [])
    one_d = spec.__class__(spec.name, spec.kind, dict(spec.attrs, kernel_shape=[3], pads=[1, 1], strides=[1],
                                                      dilations=[1]), spec.inputs, spec.outputs)
    assert not any(c.get("epilogue") == "triton" for c in registry.get("cudnn_fused_conv").configs(one_d, CPU, 2))


def test_kernel_reads_residual_in_y_layout_and_refuses_strided_y():
    """A residual in the other memory format is read by value; a y dense in neither layout is an error."""
    g = torch.Generator().manual_seed(2)
    y = torch.randn(2, 5, 3, 4, generator=g).contiguous(memory_format=torch.channels_last)
    bias, r = torch.randn(5, generator=g), torch.randn(2, 5, 3, 4, generator=g)
    want = torch.relu(y + bias[:, None, None] + r)
    torch.testing.assert_close(pointwise.bias_act_(y, bias, r, "relu"), want)
    with pytest.raises(ValueError, match="dense"):
        pointwise.bias_act_(torch.randn(2, 5, 3, 8)[..., ::2], bias, None, "relu")
