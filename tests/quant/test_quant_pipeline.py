"""quant/pipeline.py: one ordered pass list, the float passes then the precision passes, each gated on the build
target (not on which modules were imported); the builder's target for a config and device."""

import importlib

import numpy as np

from kiln.passes import BuildTarget, default_passes
from kiln.passes.registry import LAYOUT_STEPS, Stage
from kiln.quant.fold_quantize import fold_quantize
from kiln.quant.fuse_conv_chain import fuse_conv_chain
from kiln.quant.fuse_conv_pair import fuse_conv_pair
from kiln.quant.pipeline import PIPELINE, build_passes

HOPPER = BuildTarget(quantized=True, int8_conv_kernels=True)


def test_float_passes_run_for_every_target_before_the_precision_ones():
    for target in (BuildTarget(), BuildTarget(quantized=True), HOPPER):
        assert build_passes(target, Stage.OPTIMIZE) == default_passes()
    stages = [s.stage for s in PIPELINE]
    assert stages == sorted(stages, key=[Stage.OPTIMIZE, Stage.PRECISION].index)


def test_precision_passes_are_gated_on_the_target():
    layout = [s.run for s in LAYOUT_STEPS]  # every build, last
    assert build_passes(BuildTarget(), Stage.PRECISION) == layout
    assert build_passes(BuildTarget(int8_conv_kernels=True), Stage.PRECISION) == layout  # a float build on Hopper
    assert build_passes(BuildTarget(quantized=True), Stage.PRECISION) == [fold_quantize, *layout]
    assert build_passes(HOPPER, Stage.PRECISION) == [fold_quantize, fuse_conv_pair, fuse_conv_chain, *layout]


def test_the_builder_s_target_for_a_cpu_build():
    from kiln.builder.build import pass_target
    from kiln.config import BuildConfig
    from kiln.target.device import detect
    cpu = detect("cpu")
    assert pass_target(BuildConfig(device="cpu"), cpu) == BuildTarget()
    for flags in ({"int8": True}, {"fp8": True}):
        target = pass_target(BuildConfig(device="cpu", **flags), cpu)
        assert target.quantized and not target.int8_conv_kernels  # the Gluon kernels need a Hopper GPU
        assert not target.int8_chain_fits(64, 256, 64, True, 0)


def test_a_build_for_a_hopper_target_runs_the_precision_passes_once_each_in_order(tmp_path, monkeypatch):
    """A CPU build told its target has the Gluon kernels (every chain shape fitting) fuses pairs and chains, and gets
    the network that applying fold_quantize, fuse_conv_pair, fuse_conv_chain once each, in that order, gives: the
    pass manager's fixpoint changes nothing past the first round."""
    import torch

    import kiln
    build_module = importlib.import_module("kiln.builder.build")  # (kiln.builder.build is also the function)
    from kiln.passes import PassContext
    from kiln.quant.budget import copy_network
    from test_quant_fuse_conv_chain import _StrideOneProjection
    from test_quant_int8_residual import Bottleneck, small_resnet

    path, x = small_resnet(tmp_path, lambda: (torch.nn.Conv2d(16, 32, 1), _StrideOneProjection(32), Bottleneck(64),
                                              Bottleneck(64)), 64, "hopper")
    config = kiln.BuildConfig.with_shapes({"x": x.shape}, device="cpu", calibrator="minmax", int8=True,
                                          calib=str(tmp_path / "calib.npz"))
    hopper = BuildTarget(quantized=True, int8_conv_kernels=True, int8_chain_fits=lambda *shape: True)
    monkeypatch.setattr(build_module, "pass_target", lambda config, device: hopper)
    fused = kiln.build(path, config)
    monkeypatch.setattr(build_module, "pass_target", lambda config, device: BuildTarget(quantized=True))
    unfused = kiln.build(path, config)
    assert fused.build_info["passes"]["fuse_conv_pair.layers"] == 1
    assert fused.build_info["passes"]["fuse_conv_chain.layers"] == 3
    assert fused.build_info["passes"]["fuse_conv_pair"] == fused.build_info["passes"]["fuse_conv_chain"] == 1
    assert any("fused with the 1x1 conv that reads them" in n for n in fused.build_info["notes"])
    once, ctx = copy_network(unfused.network), PassContext(target=hopper)
    for p in (fold_quantize, fuse_conv_pair, fuse_conv_chain):
        p(once, ctx)
    assert str(once) == str(fused.network)
    np.testing.assert_array_equal(fused.run({"x": x})["y"], kiln.Engine(once, config, fused.device).run({"x": x})["y"])
