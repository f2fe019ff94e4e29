"""cublas_patch_conv: a stride = kernel, unpadded 2-D Conv (ViT's patch embedding) as one GEMM over the cut
patches, in NCHW and NHWC output memory; equal to the Conv reference, offered only for patch convolutions."""

import pytest
import torch

from kiln.ir import DType
from kiln.kinds import run_reference
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from kiln.target.device import Device

CPU = Device("cpu", "cpu", "cpu")
TACTIC = registry.get("cublas_patch_conv")


def _spec(kernel=(4, 4), strides=None, pads=(0, 0, 0, 0), group=1, bias=True, image=(2, 3, 10, 9)):
    g = torch.Generator().manual_seed(0)
    c = image[1] // group
    w, b = torch.randn(5, c, *kernel, generator=g), torch.randn(5, generator=g)
    f32 = DType.from_torch(torch.float32)
    attrs = {"dilations": [1, 1], "group": group, "kernel_shape": list(kernel), "pads": list(pads),
             "strides": list(strides or kernel)}
    ins = [ValueSpec(f32, image), ValueSpec(f32, tuple(w.shape), w)] + ([ValueSpec(f32, (5,), b)] if bias else [])
    return LayerSpec("p", "Conv", attrs, tuple(ins), (ValueSpec(f32, None),)), [w] + ([b] if bias else [])


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel", [(4, 4), (2, 3)])
def test_matches_reference(layout, bias, kernel):
    """Image sides that are not a multiple of the patch (10 × 9) drop the remainder, as the Conv does."""
    spec, consts = _spec(kernel, bias=bias)
    x = torch.randn(2, 3, 10, 9, generator=torch.Generator().manual_seed(1))
    want = run_reference("Conv", [x, *consts], spec.attrs)[0]
    assert TACTIC.supports(spec, CPU) is None and {"layout": layout} in TACTIC.configs(spec, CPU, 2)
    got = TACTIC.compile(spec, {"layout": layout}, CPU)([x, *consts])[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=torch.channels_last if layout == "nhwc" else torch.contiguous_format)


@pytest.mark.parametrize("kw,why", [({"strides": (2, 2)}, "patch"), ({"pads": (1, 1, 1, 1)}, "patch"),
                                    ({"group": 3}, "grouped")])
def test_only_patch_convolutions(kw, why):
    spec, _ = _spec(**kw)
    assert why in TACTIC.supports(spec, CPU)
