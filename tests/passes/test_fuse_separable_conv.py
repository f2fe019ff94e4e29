"""fuse_separable_conv: a small depthwise conv and the 1x1 conv that alone reads it become one SeparableConv in GPU
builds; the fused network gives the unfused one's outputs, also through a build, a saved plan and its reload."""

from __future__ import annotations

import collections
import copy
import importlib

import numpy as np
import torch

import kiln
from kiln.frontend.onnx import import_onnx, load_onnx
from kiln.passes import PassContext, default_passes, run_passes
from kiln.passes import fuse_separable_conv as module
from kiln.passes.fuse_separable_conv import fuse_separable_conv
from kiln.passes.manager import BuildTarget
from kiln.passes.registry import Stage
from kiln.quant.pipeline import build_passes
from models.export import export
from models.vision import MobileNetV2, randomize_bn
from passcheck import run

GPU = PassContext(target=BuildTarget(gpu=True))


def _mobilenet(tmp_path, size=32):
    torch.manual_seed(0)
    x = torch.randn(1, 3, size, size)
    path = export(randomize_bn(MobileNetV2(num_classes=10)), (x,), tmp_path / "mobilenet.onnx", dynamo=False,
                  input_names=["input"], output_names=["logits"])
    net = import_onnx(load_onnx(str(path)).proto)
    run_passes(net, default_passes(), PassContext())
    return path, net, {"input": x.numpy()}


def _fused(net, ctx=GPU):
    after = copy.deepcopy(net)
    run_passes(after, [fuse_separable_conv], ctx)
    return after


def test_every_mobilenet_block_fuses_and_agrees(tmp_path):
    _, net, feeds = _mobilenet(tmp_path)
    after = _fused(net)
    kinds = collections.Counter(layer.kind for layer in after.layers)
    # 17 depthwise convs, each read by its block's 1x1 projection (10 of them with the residual)
    assert kinds["SeparableConv"] == 17 and len(after.layers) == len(net.layers) - 17
    assert sum(layer.attrs["residual"] for layer in after.layers if layer.kind == "SeparableConv") == 10
    assert all(layer.attrs["activation"] == "Clip" for layer in after.layers if layer.kind == "SeparableConv")
    want, got = run(net, feeds), run(after, feeds)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)


def test_only_small_maps_fuse(tmp_path, monkeypatch):
    """The depthwise maps of a 64² input are 32·32·32 values down to 2·2·960: a 4,096 bound keeps the late ones."""
    _, net, _ = _mobilenet(tmp_path, 64)
    monkeypatch.setattr(module, "MAX_MAP", 4096)
    after = _fused(net)
    fused = [layer for layer in after.layers if layer.kind == "SeparableConv"]
    assert 0 < len(fused) < 17
    depthwise = {layer.name: layer for layer in net.layers if layer.kind == "FusedConv" and layer.attrs["group"] > 1}
    for layer in depthwise.values():
        size = int(np.prod(net.tensors[layer.outputs[0]].shape))
        assert any(layer.name == f.name or layer.origin[0] in f.origin for f in fused) == (size <= 4096)


def test_no_fusion_where_the_map_escapes_or_precisions_differ(tmp_path):
    _, net, _ = _mobilenet(tmp_path)
    first = next(layer for layer in net.layers if layer.kind == "FusedConv" and layer.attrs["group"] > 1)
    escapes = copy.deepcopy(net)
    escapes.outputs.append(first.outputs[0])
    assert sum(layer.kind == "SeparableConv" for layer in _fused(escapes).layers) == 16
    mixed = copy.deepcopy(net)
    next(layer for layer in mixed.layers if layer.name == first.name).precision = kiln.ir.DType.FLOAT16
    assert sum(layer.kind == "SeparableConv" for layer in _fused(mixed).layers) == 16


def test_a_gpu_build_runs_it_a_cpu_build_does_not():
    assert fuse_separable_conv in build_passes(BuildTarget(gpu=True), Stage.PRECISION)
    assert fuse_separable_conv not in build_passes(BuildTarget(), Stage.PRECISION)


def test_build_plan_round_trip(tmp_path, monkeypatch):
    """A build whose target is a GPU's (here on the CPU, the reference running SeparableConv) fuses the pairs and
    answers as the unfused build; its saved plan reloads to the same outputs."""
    path, _, feeds = _mobilenet(tmp_path)
    plain = kiln.build(path, kiln.BuildConfig(device="cpu"))
    build_module = importlib.import_module("kiln.builder.build")  # (kiln.builder.build is also the function)
    monkeypatch.setattr(build_module, "pass_target", lambda config, device: BuildTarget(gpu=True))
    fused = kiln.build(path, kiln.BuildConfig(device="cpu"))
    assert fused.build_info["passes"].get("fuse_separable_conv.layers") == 17
    want, got = plain.run(feeds), fused.run(feeds)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    reloaded = kiln.load(fused.save(tmp_path / "fused.plan")).run(feeds)
    np.testing.assert_array_equal(reloaded["logits"], got["logits"])
