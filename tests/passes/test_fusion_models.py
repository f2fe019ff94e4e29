"""The fusion passes on what torch.onnx.export writes (TorchScript and dynamo exporters): every attention
block of ViT and BERT, every conv+bn+relu of ResNet-50 and MobileNetV2 is fused, and the fused network
agrees with the unfused one at fp32 rtol 1e-5 (atol 1e-5: activations of order 1-10 after a dozen
fused layers whose references regroup a few roundings), also after a plan save/load round trip."""

from __future__ import annotations

import collections
import copy

import numpy as np
import pytest
import torch

import kiln
from models.export import export
from models.text import LastHidden, tiny_bert
from models.vision import MobileNetV2, ResNet50, ViT, randomize_bn
from passcheck import run
from kiln.frontend.onnx import import_onnx, load_onnx
from kiln.passes import PassContext, default_passes, run_passes


def _optimized(net, fuse: bool):
    net = copy.deepcopy(net)
    passes = [p for p in default_passes() if fuse or not p.__name__.startswith("fuse_")]
    run_passes(net, passes, PassContext())
    return net


def _check(path, feeds, plan: bool = True):
    """Kinds of the fused and unfused networks, which agree, as does the fused network's saved plan."""
    imported = import_onnx(load_onnx(str(path)).proto)
    fused, plain = _optimized(imported, True), _optimized(imported, False)
    want, got = run(plain, feeds), run(fused, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    if plan:  # the build also runs the layout passes: its rows may be summed in another order than `fused`'s
        built = kiln.build(path, kiln.BuildConfig(device="cpu"))
        reloaded, own = kiln.load(built.save(path.with_suffix(".plan"))).run(feeds), built.run(feeds)
        for name in want:
            np.testing.assert_array_equal(reloaded[name], own[name], err_msg=name)
            np.testing.assert_allclose(own[name], got[name], rtol=1e-5, atol=1e-5, err_msg=name)
    return collections.Counter(l.kind for l in fused.layers), collections.Counter(l.kind for l in plain.layers)


DYNAMO = pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])


def _vision(model, shape, tmp_path, dynamo, name, plan=True):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    path = export(model, (x,), tmp_path / f"{name}.onnx", dynamo=dynamo, input_names=["input"],
                  output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return _check(path, {"input": x.numpy()}, plan)


def test_resnet50(tmp_path):
    torch.manual_seed(0)
    fused, plain = _vision(randomize_bn(ResNet50(num_classes=10)), (1, 3, 32, 32), tmp_path, False, "resnet50",
                           plan=False)  # 100 MB of weights; MobileNetV2 covers FusedConv plans
    # 53 convs: 49 take their ReLU (16 of them also the residual Add), the 4 downsample convs stay plain
    assert plain["Conv"] == 53 and plain["Relu"] == 49 and plain["Add"] == 16
    assert fused["FusedConv"] == 49 and fused["Conv"] == 4
    assert not {"Relu", "Add", "BatchNormalization"} & set(fused)


def test_mobilenet_v2(tmp_path):
    torch.manual_seed(0)
    fused, plain = _vision(randomize_bn(MobileNetV2(num_classes=10)), (1, 3, 32, 32), tmp_path, False, "mobilenet")
    # 35 conv+bn+ReLU6 and 10 residual projections fuse; the 7 projections without a residual stay Convs
    assert plain["Clip"] == 35 and plain["Add"] == 10
    assert fused["FusedConv"] == 45 and fused["Conv"] == 7 and not {"Clip", "Add"} & set(fused)


@DYNAMO
def test_vit(tmp_path, dynamo):
    torch.manual_seed(0)
    model = ViT(image_size=32, dim=64, layers=2, heads=4, mlp=128, num_classes=10).eval()
    fused, plain = _vision(model, (2, 3, 32, 32), tmp_path, dynamo, "vit")
    assert fused["FusedAttention"] == 2 and "Softmax" not in fused and "Erf" not in fused
    assert fused["FusedGemm"] == 6  # per block: the QKV projection and both MLP layers (GELU)
    assert fused["AddLayerNorm"] == 4  # both residual Adds of each block feed a LayerNorm
    assert len(plain) and sum(fused.values()) < sum(plain.values())


@DYNAMO
def test_bert(tmp_path, dynamo):
    model = LastHidden(tiny_bert(layers=2))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 8:] = 0
    args = (ids, mask, torch.zeros(2, 16, dtype=torch.int64))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    path = export(model, args, tmp_path / "bert.onnx", dynamo=dynamo, input_names=names,
                  output_names=["last_hidden_state", "pooler_output"],
                  dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
    fused, _ = _check(path, {n: a.numpy() for n, a in zip(names, args)})
    assert fused["FusedAttention"] == 2 and "Softmax" not in fused and "Erf" not in fused
    # Q, K and V merged into one (then Split), output, both FFN layers per block, and the pooler (Tanh)
    assert fused["FusedGemm"] == 9 and fused["Split"] == 2
    assert fused["AddLayerNorm"] == 4 and "MatMul" not in fused
    # the embedding lookups, their sum and its LayerNorm: one layer, except from the TorchScript exporter's dynamic
    # export, whose position lookup's shape ONNX shape inference leaves unknown
    assert fused["EmbedLayerNorm"] == (1 if dynamo else 0)
