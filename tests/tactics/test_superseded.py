"""Superseded tactics: below opt level 4 the autotuner leaves out a tactic whose named successor takes the layer
(fewer compiles per build), says so in the layer's refused list, and tries it again at level 4."""

from kiln.tactics import registry
from kiln.tactics.registry import Tactic


def _t(name, superseded_by=()):
    return Tactic(name, ("Relu",), lambda spec, config, device: None, superseded_by=superseded_by)


def test_a_superseded_tactic_is_left_out_only_where_its_successor_runs_and_below_level_4():
    old, new, other = _t("old", ("new",)), _t("new"), _t("other")
    assert [(t.name, why) for t, why in registry.untried([old, new, other], 3)] == \
        [("old", "superseded by new on this device (tried from opt level 4)")]
    assert registry.untried([old, other], 3) == []  # its successor does not take the layer (another GPU)
    assert registry.untried([old, new], registry.EXHAUSTIVE) == []


def test_every_successor_named_is_a_registered_tactic():
    registry._load()
    named = {s for t in registry.TACTICS.values() for s in t.superseded_by}
    assert named and named <= set(registry.TACTICS)
    assert {"triton_int8_conv_tma", "triton_int8_conv_chain", "triton_int8_conv_s2d", "torch_int_mm",
            "triton_int8_conv", "triton_int8_conv_pair", "triton_tma_gemm", "cudnn_conv", "cudnn_fused_conv"} == \
        {t.name for t in registry.TACTICS.values() if t.superseded_by}
