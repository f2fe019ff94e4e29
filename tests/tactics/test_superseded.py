"""Superseded tactics: below opt level 4 the autotuner leaves out a tactic whose named successor takes the layer
(fewer compiles per build), says so in the layer's refused list, and tries it again at level 4."""

import pytest
import torch

from kiln.ir import DType
from kiln.tactics import registry, triton_int8
from kiln.tactics.registry import Tactic
from kiln.tactics.spec import LayerSpec, ValueSpec


def _t(name, superseded_by=(), when=lambda spec: True):
    return Tactic(name, ("Relu",), lambda spec, config, device: None, superseded_by=superseded_by,
                  superseded_when=when)


def test_a_superseded_tactic_is_left_out_only_where_its_successor_runs_and_below_level_4():
    old, new, other = _t("old", ("new",)), _t("new"), _t("other")
    assert [(t.name, why) for t, why in registry.untried([old, new, other], 3, None)] == \
        [("old", "superseded by new on this device (tried from opt level 4)")]
    assert registry.untried([old, other], 3, None) == []  # its successor does not take the layer (another GPU)
    assert registry.untried([old, new], registry.EXHAUSTIVE, None) == []


def test_superseded_only_on_the_layers_its_rule_names():
    old, new = _t("old", ("new",), when=lambda spec: spec == "big"), _t("new")
    assert [t.name for t, _ in registry.untried([old, new], 3, "big")] == ["old"]
    assert registry.untried([old, new], 3, "small") == []


def _quant(kind: str, x: tuple, w: tuple, out: tuple, **attrs) -> LayerSpec:
    i8 = ValueSpec(DType.INT8, x)
    return LayerSpec("l", kind, attrs, (i8, ValueSpec(DType.INT8, w, torch.zeros(w, dtype=torch.int8))),
                     (ValueSpec(DType.FLOAT16, out),))


@pytest.mark.parametrize("spec, outpaced", [
    (_quant("QuantConv", (64, 64, 56, 56), (64, 64, 3, 3), (64, 64, 56, 56), pads=[1] * 4), True),  # im2col
    (_quant("QuantConv", (1, 64, 56, 56), (64, 64, 3, 3), (1, 64, 56, 56), pads=[1] * 4), True),  # at batch 1 too
    (_quant("QuantConv", (64, 1024, 14, 14), (256, 1024, 1, 1), (64, 256, 14, 14)), True),  # 3.3G multiply-adds
    (_quant("QuantConv", (1, 1024, 14, 14), (256, 1024, 1, 1), (1, 256, 14, 14)), False),  # batch 1: 51M
    (_quant("QuantGemm", (64, 2048), (1000, 2048), (64, 1000)), False),  # ResNet-50's classifier at batch 64
])
def test_the_pointer_fed_int8_gemm_is_outpaced_on_im2col_convs_and_large_gemms(spec, outpaced):
    """ResNet-50 int8's measured layers (H200 batch 64-256, H100 batch 1): where the Gluon kernels take them."""
    assert triton_int8.outpaced(spec) is outpaced


def test_every_successor_named_is_a_registered_tactic():
    registry._load()
    named = {s for t in registry.TACTICS.values() for s in t.superseded_by}
    assert named and named <= set(registry.TACTICS)
    assert {"triton_int8_gemm", "triton_int8_conv_tma", "triton_int8_conv_chain", "triton_int8_conv_s2d",
            "torch_int_mm", "triton_int8_conv", "triton_int8_conv_pair", "triton_tma_gemm", "cudnn_conv",
            "cudnn_fused_conv"} == \
        {t.name for t in registry.TACTICS.values() if t.superseded_by}
