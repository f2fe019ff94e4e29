"""quant/fuse_conv_pair.py and QuantConvPair: a 1x1 int8 conv whose only reader adds it as a quantized residual fuses
into that reader (a bottleneck's last conv and its strided downsample); the pair's reference equals the first conv
with the second's fp32 value as a float residual; the Triton split tactic gives the reference's bits (CPU,
TRITON_INTERPRET=1); the Gluon pair kernel compiles for sm90 and, on a Hopper GPU, gives the reference's bits."""

import numpy as np
import pytest
import torch

from kiln.runtime.engine import Engine
from kiln.ir import DType
from kiln.kernels import int8_conv_pair
from kiln.kinds import run_reference
from kiln.passes import BuildTarget, PassContext
from kiln.quant.budget import copy_network
from kiln.quant.fuse_conv_pair import fuse_conv_pair
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from test_kernels_int8 import CPU, EPI
from test_quant_int8_residual import Bottleneck, Projection, _cosine, small_resnet

CONSTS = (1, 2, 3, 5, 6, 7)  # weights, scales, biases


def _pair_case(g, size=7, c=16, c2=32, co=48, strides2=(2, 2), device="cpu", bias2=True):
    """A QuantConvPair spec (second input strided) and its inputs and reference output."""
    oh = size
    h2 = (size - 1) * strides2[0] + 1 + (size % 2 if strides2[0] > 1 else 0)  # onto the same map, even or odd
    i8 = lambda *s: torch.randint(-127, 128, s, generator=g, dtype=torch.int8)  # noqa: E731
    inputs = [i8(2, c, oh, oh).contiguous(memory_format=torch.channels_last), i8(co, c, 1, 1),
              torch.rand(co, generator=g) * 1e-3 + 1e-4, torch.randn(co, generator=g),
              i8(2, c2, h2, h2).contiguous(memory_format=torch.channels_last), i8(co, c2, 1, 1),
              torch.rand(co, generator=g) * 1e-3 + 1e-4, torch.randn(co, generator=g) if bias2 else None]
    inputs = [None if t is None else t.to(device) for t in inputs]
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
             "strides": [1, 1], "x_scale": 0.1, "x2_scale": 0.05, "strides2": list(strides2), "out_scale": 0.3} | \
        EPI | {"activation": "Relu"}
    want = run_reference("QuantConvPair", inputs, attrs)[0]
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape),
                                                  t if i in CONSTS else None) for i, t in enumerate(inputs))
    spec = LayerSpec("pair", "QuantConvPair", attrs, vals, (ValueSpec(DType.INT8, tuple(want.shape)),))
    return spec, inputs, want


def _build(tmp_path):
    """A projection block then an identity block (the projection's output int8: read by a conv and a residual),
    built int8 on the CPU (no pairs fused there: the build fuses them where the Gluon kernel runs), and fp32."""
    import kiln
    path, x = small_resnet(tmp_path, lambda: (Projection(16), Bottleneck(32)), 32, "pair")
    shapes = {"x": x.shape}
    return kiln.build(path, kiln.BuildConfig.with_shapes(shapes, device="cpu", calibrator="minmax", int8=True,
                                                         calib=str(tmp_path / "calib.npz"))), \
        kiln.build(path, kiln.BuildConfig.with_shapes(shapes, device="cpu")), x


def _residual_pair(net):
    """The first block's shortcut pair: (the conv whose int8 output is the residual, the conv reading it)."""
    reader = next(la for la in net.layers if la.kind == "QuantConv" and len(la.inputs) > 4 and la.inputs[4])
    return net.producers()[reader.inputs[4]], reader


def fused_pairs(net) -> int:
    """Run the pass as the build does, on a Hopper build target; how many pairs it fused."""
    ctx = PassContext(target=BuildTarget(quantized=True, int8_conv_kernels=True))
    changed = fuse_conv_pair(net, ctx)
    assert changed == bool(ctx.log.get("fuse_conv_pair.layers"))
    return ctx.log.get("fuse_conv_pair.layers", 0)


def test_pair_reference_is_the_first_conv_with_the_second_as_an_fp32_residual():
    g = torch.Generator().manual_seed(0)
    spec, inputs, want = _pair_case(g)
    a = spec.attrs
    second = run_reference("QuantConv", inputs[4:8], dict(a, x_scale=a["x2_scale"], strides=a["strides2"],
                                                          out_scale=None, activation="none"))[0]
    assert second.dtype == torch.float32 and second.shape == want.shape
    first = run_reference("QuantConv", inputs[:4] + [second], a)[0]
    assert want.dtype == torch.int8 and torch.equal(want, first)


def test_pass_fuses_the_projection_shortcut_into_the_block_s_last_conv(tmp_path):
    engine, fp32, x = _build(tmp_path)
    assert not any(la.kind == "QuantConvPair" for la in engine.network.layers)
    inner, outer = _residual_pair(engine.network)
    net = copy_network(engine.network)
    # before ⇒ after: the shortcut conv goes, the conv adding it becomes a QuantConvPair in its place
    want = [(la.name, "QuantConvPair" if la.name == outer.name else la.kind) for la in net.layers
            if la.name != inner.name]
    assert fused_pairs(net) == 1  # the identity block's residual is the projection's output, read twice
    assert [(la.name, la.kind) for la in net.layers] == want
    pair = next(la for la in net.layers if la.kind == "QuantConvPair")
    assert pair.name == outer.name and pair.inputs[:4] == outer.inputs[:4] and pair.inputs[4:] == inner.inputs[:4]
    assert pair.attrs["strides"] != pair.attrs["strides2"]  # one of them the strided shortcut
    assert pair.attrs["x2_scale"] == inner.attrs["x_scale"] and pair.attrs["out_scale"] == outer.attrs["out_scale"]
    assert "res_scale" not in pair.attrs and inner.outputs[0] not in net.tensors
    assert inner.name not in {la.name for la in net.layers} and set(inner.origin) <= set(pair.origin)
    fused = Engine(net, engine.config, engine.device)
    got, unfused = fused.run({"x": x})["y"], engine.run({"x": x})["y"]
    assert _cosine(got, unfused) >= 0.9999 and _cosine(got, fp32.run({"x": x})["y"]) >= 0.999
    assert not np.array_equal(got, unfused)  # the shortcut's int8 rounding is gone


def test_pass_leaves_a_residual_with_another_reader_or_an_activation(tmp_path):
    engine, _, _ = _build(tmp_path)
    inner, _ = _residual_pair(engine.network)
    net = copy_network(engine.network)
    net.outputs.append(inner.outputs[0])  # read by the user too: it must still be written
    assert fused_pairs(net) == 0
    net = copy_network(engine.network)
    next(la for la in net.layers if la.name == inner.name).attrs["activation"] = "Relu"
    assert fused_pairs(net) == 0


@pytest.mark.parametrize("size,strides2", [(4, (2, 2)), (5, (2, 2)), (3, (1, 1))])
def test_split_tactic_gives_the_reference_bits(size, strides2):
    """Two Triton implicit-GEMM convs (the second's fp32 map as the first's float residual), even and odd maps."""
    g = torch.Generator().manual_seed(1)
    spec, inputs, want = _pair_case(g, size=size, strides2=strides2, bias2=size != 3)
    t = registry.get("triton_int8_conv_pair")
    assert t.supports(spec, CPU) is None
    for cfg in t.configs(spec, CPU, 2)[:2]:
        assert torch.equal(t.compile(spec, cfg, CPU)(inputs)[0], want), cfg


def test_pair_tactics_refuse_what_they_cannot_run():
    g = torch.Generator().manual_seed(2)
    spec, _, _ = _pair_case(g)
    gelu = LayerSpec(spec.name, spec.kind, dict(spec.attrs, activation="Sigmoid"), spec.inputs, spec.outputs)
    assert registry.get("triton_int8_conv_pair").supports(gelu, CPU) is None  # its Triton epilogue has it
    if int8_conv_pair.available():
        assert "activations" in registry.get("triton_int8_conv_pair_wgmma").supports(gelu, CPU)
    float_out = LayerSpec(spec.name, spec.kind, dict(spec.attrs, out_scale=None), spec.inputs, spec.outputs)
    assert "int8 output" in registry.get("triton_int8_conv_pair").supports(float_out, CPU)


def _desc_sig(block):
    from triton.experimental.gluon import language as gl
    return f"tensordesc<i8[{','.join(map(str, block))}],{gl.NVMMASharedLayout.get_default_for(block, gl.int8)!r}>"


@pytest.mark.skipif(not int8_conv_pair.available(), reason="this triton has no Gluon")
def test_pair_kernel_compiles_for_hopper_with_one_wgmma_in_flight():
    """AOT compile for sm90 (no GPU needed), every tile ResNet-50's layer-1 pair gets: 4-D TMA boxes, one wgmma in
    flight while the next slot refills, products and sums rounded apart (no FMA), no register spills to local
    memory, the output leaving by TMA."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    cfgs = int8_conv_pair.configs(56, 56, 256, 64, 64, 227 * 1024)
    assert cfgs and all(c["BH"] * c["BW"] * c["BLOCK_N"] <= 64 * 32 * c["num_warps"] for c in cfgs)
    assert all(int8_conv_pair.smem_bytes(c, 64, 64) * c["stream"] <= 227 * 1024 for c in cfgs)
    wide = int8_conv_pair.configs(28, 28, 512, 128, 256, 227 * 1024)  # layer 2: 128-byte box rows where they fit
    assert wide[0]["BLOCK_K"] == 128 and all(int8_conv_pair.smem_bytes(c, 128, 256) <= 227 * 1024 for c in wide)
    for cfg in cfgs + wide[:1]:
        bh, bw, bn, bk = cfg["BH"], cfg["BW"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        sig = {"x_desc": _desc_sig([1, bh, bw, bk]), "w_desc": _desc_sig([bn, bk]),
               "x2_desc": _desc_sig([1, bh, bw, bk]),
               "w2_desc": _desc_sig([bn, bk]), "y_desc": _desc_sig([1, bh, bw, bn]), "scale": "*fp32", "bias": "*fp32",
               "scale2": "*fp32", "bias2": "*fp32", "out_inv": "fp32"}
        sig |= dict.fromkeys("CO tiles_w tiles_hw tiles".split(), "i32")
        consts = {"HAS_BIAS": True, "HAS_BIAS2": True, "ACT": "relu", "KT1": 1, "KT2": 1, "STAGES": cfg["STAGES"],
                  "PDL": True}
        k = triton.compile(GluonASTSource(int8_conv_pair._pair_kernel, sig | dict.fromkeys(consts, "constexpr"),
                                          consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": cfg["num_warps"], "enable_fp_fusion": False})
        ptx = k.asm["ptx"]
        assert "cp.async.bulk.tensor.4d" in ptx and "wgmma.wait_group.sync.aligned 1;" in ptx, cfg
        assert "cp.async.bulk.tensor.4d.global.shared" in ptx, cfg  # the TMA store
        assert "fma.rn.f32" not in ptx and ".local" not in ptx, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("c,c2", [(64, 128), (128, 256)])
@pytest.mark.parametrize("size,strides2", [(14, (2, 2)), (13, (2, 2)), (9, (1, 1))])
def test_gpu_pair_kernel_gives_the_reference_bits(size, strides2, c, c2):
    """Every tile, the second input strided or not, ragged maps, 64- and 128-byte channel blocks: the reference's
    bits."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (wgmma, TMA)")
    if not int8_conv_pair.available():
        pytest.skip("this triton has no Gluon")
    from kiln.target.device import Device
    dev = Device("cuda", "cuda", "cuda:0")
    g = torch.Generator().manual_seed(3)
    spec, inputs, want = _pair_case(g, size=size, c=c, c2=c2, co=128, strides2=strides2, device="cuda")
    t = registry.get("triton_int8_conv_pair_wgmma")
    assert t.supports(spec, dev) is None
    for cfg in t.configs(spec, dev, 3):
        assert torch.equal(t.compile(spec, cfg, dev)(inputs)[0], want), cfg


def test_the_measured_winners_are_among_the_configs_the_autotuner_times():
    """The autotuner times the first CONFIGS_PER_TACTIC[3] configs: ResNet-50's winning pair tiles (H100,
    2026-11-24) must be among them: layer 1's 4-warp 8x8x128, layer 2's 4x32x128 on 128-byte blocks."""
    from kiln.builder.autotune import CONFIGS_PER_TACTIC
    timed = CONFIGS_PER_TACTIC[3]
    l1 = int8_conv_pair.configs(56, 56, 256, 64, 64, 227 * 1024)[:timed]
    assert any((c["BH"], c["BW"], c["BLOCK_N"], c["num_warps"], c["STAGES"]) == (8, 8, 128, 4, 4) for c in l1)
    l2 = int8_conv_pair.configs(28, 28, 512, 128, 256, 227 * 1024)[:timed]
    assert any((c["BH"], c["BW"], c["BLOCK_N"], c["BLOCK_K"]) == (4, 32, 128, 128) for c in l2)
