"""quant/fuse_conv_chain.py and QuantConvChain: a 1x1 int8 conv and the 1x1 conv reading its output fuse into one
layer with both outputs (a bottleneck's last conv and the next block's first); the chain's reference is the two
convs; the fused network gives the unfused one's bits; the Triton split tactic gives the reference's bits (CPU,
TRITON_INTERPRET=1); the Gluon chain kernel compiles for sm90 and, on a Hopper GPU, gives the reference's bits."""

import numpy as np
import pytest
import torch

from kiln.runtime.engine import Engine
from kiln.ir import DType
from kiln.kernels import int8_gemm_chain
from kiln.kinds import run_reference
from kiln.kinds.quantized import second_attrs
from kiln.passes import BuildTarget, PassContext
from kiln.quant.budget import copy_network
from kiln.quant.fuse_conv_chain import fuse_conv_chain
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from test_kernels_int8 import CPU, EPI
from test_quant_int8_residual import Bottleneck, small_resnet

CONSTS = (1, 2, 3, 5, 6, 7, 9, 10, 11)  # weights, scales, biases
ANY = lambda *shape: True  # noqa: E731  (every shape fits)
SMEM = 227 * 1024  # an H100's shared memory per block


def _chain_case(g, m_pixels=(2, 5, 7), k=32, n=64, n2=16, device="cpu", residual=True, bias2=True, kx=0):
    """A QuantConvChain spec over an [N, K, H, W] map and its inputs and reference outputs; with kx, the first conv
    a pair whose stride-1 shortcut conv reads a kx-channel map (no residual)."""
    b, h, w = m_pixels
    i8 = lambda *s: torch.randint(-127, 128, s, generator=g, dtype=torch.int8)  # noqa: E731
    nhwc = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    inputs = [nhwc(i8(b, k, h, w)), i8(n, k, 1, 1), torch.rand(n, generator=g) * 1e-3 + 1e-4,
              torch.randn(n, generator=g),
              nhwc(i8(b, n, h, w)) if residual else None, i8(n2, n, 1, 1), torch.rand(n2, generator=g) * 1e-3 + 1e-4,
              torch.randn(n2, generator=g) if bias2 else None]
    if kx:
        inputs[4] = None
        inputs += [nhwc(i8(b, kx, h, w)), i8(n, kx, 1, 1), torch.rand(n, generator=g) * 1e-3 + 1e-4,
                   torch.randn(n, generator=g)]
    inputs = [None if t is None else t.to(device) for t in inputs]
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": 0.3, "out2_scale": 0.2, "activation2": "Relu",
             "activation2_params": []} | EPI | {"activation": "Relu"}
    attrs |= {"res_scale": 0.25} if residual and not kx else {}
    attrs |= {"x2_scale": 0.07, "strides2": [1, 1]} if kx else {}
    want = run_reference("QuantConvChain", inputs, attrs)
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape),
                                                  t if i in CONSTS else None) for i, t in enumerate(inputs))
    spec = LayerSpec("chain", "QuantConvChain", attrs, vals, tuple(ValueSpec(DType.INT8, tuple(t.shape)) for t in want))
    return spec, inputs, want


def _build(tmp_path):
    """Three identity bottlenecks (each block's output int8: read by the next block's first conv and as its
    residual), built int8 on the CPU (no chains fused there: the build fuses them where the Gluon kernel runs)."""
    import kiln
    path, x = small_resnet(tmp_path, lambda: (Bottleneck(16), Bottleneck(16), Bottleneck(16)), 16, "chain")
    return kiln.build(path, kiln.BuildConfig.with_shapes({"x": x.shape}, device="cpu", calibrator="minmax", int8=True,
                                                         calib=str(tmp_path / "calib.npz"))), x


def fused_chains(net, fits) -> int:
    """Run the pass as the build does, on a Hopper build target whose chain kernel takes what `fits` says; how
    many chains it fused."""
    ctx = PassContext(target=BuildTarget(quantized=True, int8_conv_kernels=True, int8_chain_fits=fits))
    changed = fuse_conv_chain(net, ctx)
    assert changed == bool(ctx.log.get("fuse_conv_chain.layers"))
    return ctx.log.get("fuse_conv_chain.layers", 0)


def test_chain_reference_is_the_two_convs():
    g = torch.Generator().manual_seed(0)
    spec, inputs, (y, z) = _chain_case(g)
    first = run_reference("QuantConv", inputs[:5], spec.attrs)[0]
    assert y.dtype == torch.int8 and torch.equal(y, first)
    second = run_reference("QuantConv", [first, *inputs[5:]], second_attrs(spec.attrs))[0]
    assert z.dtype == torch.int8 and z.shape == (2, 16, 5, 7) and torch.equal(z, second)
    assert (z >= 0).all() and z.any()  # the second conv's ReLU, and not all zeros


def test_chain_reference_after_a_pair_is_the_pair_then_the_conv():
    g = torch.Generator().manual_seed(5)
    spec, inputs, (y, z) = _chain_case(g, kx=48)
    pair = run_reference("QuantConvPair", inputs[:4] + inputs[8:], spec.attrs)[0]
    assert torch.equal(y, pair) and torch.equal(z, run_reference("QuantConv", [pair, *inputs[5:8]],
                                                                 second_attrs(spec.attrs))[0])


def test_pass_fuses_each_block_s_last_conv_with_the_next_block_s_first(tmp_path):
    engine, x = _build(tmp_path)
    assert not any(la.kind == "QuantConvChain" for la in engine.network.layers)
    net = copy_network(engine.network)
    before = {la.name: la for la in net.layers}
    assert fused_chains(net, ANY) == 2  # block 0 → block 1, block 1 → block 2
    # before ⇒ after: each pair of convs becomes one QuantConvChain in the first's place, the second gone
    kinds = [la.kind for la in net.layers]
    assert kinds.count("QuantConvChain") == 2 and len(kinds) == len(before) - 2
    assert [la.kind for la in before.values()].count("QuantConv") - kinds.count("QuantConv") == 4
    chains = [la for la in net.layers if la.kind == "QuantConvChain"]
    for chain in chains:
        first, second = (before[n] for n in chain.name.split("+"))
        assert chain.outputs == [first.outputs[0], second.outputs[0]] and second.name not in {la.name for la in
                                                                                              net.layers}
        assert chain.inputs[:5] == first.inputs[:5] and chain.inputs[5:] == second.inputs[1:4]
        assert chain.attrs["out2_scale"] == second.attrs["out_scale"] and chain.attrs["res_scale"] is not None
        assert chain.attrs["activation2"] == second.attrs["activation"] == "Relu"
        assert set(first.origin + second.origin) == set(chain.origin)
    fused = Engine(net, engine.config, engine.device)
    assert np.array_equal(fused.run({"x": x})["y"], engine.run({"x": x})["y"])  # the same arithmetic, fused


class _StrideOneProjection(torch.nn.Module):
    """A bottleneck whose shortcut is a stride-1 1x1 conv (ResNet's layer-1 projection block)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(c, c, 1), torch.nn.Conv2d(c, c, 3, padding=1)
        self.conv3, self.down = torch.nn.Conv2d(c, 2 * c, 1), torch.nn.Conv2d(c, 2 * c, 1)

    def forward(self, x):
        return torch.relu(self.conv3(torch.relu(self.conv2(torch.relu(self.conv1(x))))) + self.down(x))


def test_pass_fuses_a_stride_one_pair_with_the_next_block_s_first_conv(tmp_path):
    """Layer 1's projection block: its pair (quant/fuse_conv_pair.py) then the next block's first conv, one chain
    with the pair's shortcut conv as inputs 8-11; the same bits as the pair alone."""
    import kiln
    from kiln.quant.fuse_conv_pair import fuse_conv_pair
    path, x = small_resnet(tmp_path, lambda: (_StrideOneProjection(16), Bottleneck(32)), 32, "pairchain")
    engine = kiln.build(path, kiln.BuildConfig.with_shapes({"x": x.shape}, device="cpu", calibrator="minmax",
                                                           int8=True, calib=str(tmp_path / "calib.npz")))
    paired = copy_network(engine.network)
    assert fuse_conv_pair(paired, PassContext(target=BuildTarget(quantized=True, int8_conv_kernels=True)))
    pair = next(la for la in paired.layers if la.kind == "QuantConvPair")
    chained = copy_network(paired)
    seen = []
    assert fused_chains(chained, lambda *shape: seen.append(shape) or True) == 1
    assert seen[0] == (16, 32, 16, False, 16)  # (K, N, N2, residual, the shortcut's K)
    chain = next(la for la in chained.layers if la.kind == "QuantConvChain")
    assert chain.name.startswith(pair.name + "+") and chain.inputs[:4] == pair.inputs[:4] and not chain.inputs[4]
    assert chain.inputs[8:] == pair.inputs[4:8] and chain.attrs["x2_scale"] == pair.attrs["x2_scale"]
    got = Engine(chained, engine.config, engine.device).run({"x": x})["y"]
    assert np.array_equal(got, Engine(paired, engine.config, engine.device).run({"x": x})["y"])


def test_pass_leaves_what_the_kernel_cannot_take(tmp_path):
    engine, _ = _build(tmp_path)
    assert fused_chains(copy_network(engine.network), lambda *shape: False) == 0
    seen = []
    fused_chains(copy_network(engine.network), lambda *shape: seen.append(shape) or False)
    assert seen and all(shape == (8, 16, 8, True, 0) for shape in seen)  # (K, N, N2, residual, KX)
    net = copy_network(engine.network)
    for la in net.layers:  # the second conv reading at another scale than the first wrote
        if la.kind == "QuantConv" and la.attrs.get("x_scale") is not None:
            la.attrs["x_scale"] *= 1.5
    assert fused_chains(net, ANY) == 0


@pytest.mark.parametrize("residual,bias2,kx", [(True, True, 0), (False, False, 0), (False, True, 48)])
def test_split_tactic_gives_the_reference_bits(residual, bias2, kx):
    g = torch.Generator().manual_seed(1)
    spec, inputs, want = _chain_case(g, residual=residual, bias2=bias2, kx=kx)
    t = registry.get("triton_int8_conv_chain")
    assert t.supports(spec, CPU) is None
    for cfg in t.configs(spec, CPU, 2)[:2]:
        got = t.compile(spec, cfg, CPU)(inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), cfg


def test_chain_tactics_refuse_what_they_cannot_run():
    g = torch.Generator().manual_seed(2)
    spec, _, _ = _chain_case(g)
    sig = LayerSpec(spec.name, spec.kind, dict(spec.attrs, activation2="Sigmoid"), spec.inputs, spec.outputs)
    assert registry.get("triton_int8_conv_chain").supports(sig, CPU) is None  # its Triton epilogue has it
    if int8_gemm_chain.available():
        assert "activations" in registry.get("triton_int8_conv_chain_wgmma").supports(sig, CPU)
    floats = LayerSpec(spec.name, spec.kind, dict(spec.attrs, out2_scale=None), spec.inputs, spec.outputs)
    assert "int8 outputs" in registry.get("triton_int8_conv_chain").supports(floats, CPU)


def test_configs_fit_shared_memory_and_refuse_long_reductions(monkeypatch):
    """ResNet-50's layer-1 and layer-2 chains get tiles whose shared memory fits (as many programs to an SM as the
    config says); K past one 128-byte box row, N2 past one wgmma, or weights too big for shared memory get none;
    the tactic offers the kernel's configs for the spec's shapes."""
    for k, n, n2 in [(64, 256, 64), (64, 256, 128), (128, 512, 128)]:
        cfgs = int8_gemm_chain.configs(200704, k, n, n2, SMEM, True)
        assert cfgs and all(c["stream"] * int8_gemm_chain.smem_bytes(c, k, n, n2, True) <= SMEM for c in cfgs)
    assert any(c["stream"] == 2 for c in int8_gemm_chain.configs(200704, 64, 256, 64, SMEM, True))
    spec, _, _ = _chain_case(torch.Generator().manual_seed(4), (2, 14, 14), 64, 256, 64)
    from kiln.tactics import triton_int8_chain
    monkeypatch.setattr(triton_int8_chain, "smem_limit", lambda device: SMEM)
    want = int8_gemm_chain.configs(2 * 14 * 14, 64, 256, 64, SMEM, True)
    assert [{k: c[k] for k in int8_gemm_chain.CONFIG_KEYS} for c in triton_int8_chain.wgmma_configs(spec, CPU, 3)] \
        == want
    assert int8_gemm_chain.configs(None, 256, 1024, 256, SMEM, True) == []  # layer 3: weights too big
    assert int8_gemm_chain.configs(None, 160, 256, 64, SMEM, True) == []
    assert int8_gemm_chain.configs(None, 64, 256, 512, SMEM, True) == []


def _desc_sig(block):
    from triton.experimental.gluon import language as gl
    return f"tensordesc<i8[{','.join(map(str, block))}],{gl.NVMMASharedLayout.get_default_for(block, gl.int8)!r}>"


@pytest.mark.skipif(not int8_gemm_chain.available(), reason="this triton has no Gluon")
@pytest.mark.parametrize("residual,kx", [(True, 0), (False, 64)])
def test_chain_kernel_compiles_for_hopper(residual, kx):
    """AOT compile for sm90 (no GPU needed), ResNet-50 layer 1's first tiles, after a conv with a residual or a
    pair: wgmma for every GEMM, TMA loads and stores, products and sums rounded apart (no FMA), no register spills
    to local memory, shared memory as smem_bytes counts it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    k, n, n2 = 64, 256, 64
    for cfg in int8_gemm_chain.configs(None, k, n, n2, SMEM, residual, kx)[:2]:
        bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
        sig = {"a_desc": _desc_sig([bm, k]), "w_desc": _desc_sig([bn, k]), "r_desc": _desc_sig([bm, bn]),
               "w2_desc": _desc_sig([n2, bn]), "y_desc": _desc_sig([bm, bn]), "z_desc": _desc_sig([bm, n2]),
               "x_desc": _desc_sig([bm, kx or k]), "wx_desc": _desc_sig([bn, kx or k])}
        sig |= dict.fromkeys("scale bias scale2 bias2 scale_x bias_x".split(), "*fp32")
        sig |= {"M": "i32", "out_inv": "fp32", "res_scale": "fp32", "out2_inv": "fp32"}
        consts = {"HAS_BIAS": True, "HAS_RES": residual, "ACT": "relu", "HAS_BIAS2": True, "ACT2": "relu",
                  "HAS_X": bool(kx), "HAS_BIAS_X": bool(kx), "NC": n // bn, "STAGES": cfg["STAGES"],
                  "RSTAGES": cfg["RSTAGES"], "PDL": bool(kx)}
        kernel = triton.compile(GluonASTSource(int8_gemm_chain._chain_kernel, sig | dict.fromkeys(consts, "constexpr"),
                                               consts), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": cfg["num_warps"], "enable_fp_fusion": False})
        ptx = kernel.asm["ptx"]
        assert ("griddepcontrol.wait" in ptx) == bool(kx), cfg  # programmatic dependent launch only when asked
        assert ptx.count("wgmma.mma_async") >= (3 if kx else 2) and "cp.async.bulk.tensor.2d.global.shared" in ptx
        assert "fma.rn.f32" not in ptx and ".local" not in ptx, cfg
        assert 0 <= int8_gemm_chain.smem_bytes(cfg, k, n, n2, residual, kx) - kernel.metadata.shared < 256, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("k,n,n2", [(64, 256, 64), (64, 256, 128), (128, 512, 128)])
@pytest.mark.parametrize("pixels,residual,kx", [((2, 14, 14), True, 0), ((3, 7, 9), True, 0), ((1, 5, 5), False, 0),
                                                ((3, 7, 9), False, 64)])
def test_gpu_chain_kernel_gives_the_reference_bits(k, n, n2, pixels, residual, kx):
    """Every config, ragged row counts, with a residual, none, or a pair's shortcut conv: both outputs bit for
    bit."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU (wgmma, TMA)")
    if not int8_gemm_chain.available():
        pytest.skip("this triton has no Gluon")
    from kiln.target.device import Device
    dev = Device("cuda", "cuda", "cuda:0")
    g = torch.Generator().manual_seed(3)
    spec, inputs, want = _chain_case(g, pixels, k, n, n2, device="cuda", residual=residual, kx=kx)
    t = registry.get("triton_int8_conv_chain_wgmma")
    assert t.supports(spec, dev) is None
    for cfg in t.configs(spec, dev, 3):
        got = t.compile(spec, cfg, dev)(inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), cfg


def test_the_build_fuses_only_chains_that_run_two_programs_to_an_sm(monkeypatch):
    """Measured on an H100 (results/int8-chain-probe-…): layer 1's chains beat the two GEMMs, layer 2's (weights
    128 KiB: one program to an SM) lost; `fits` says so from shared memory alone."""
    from kiln.tactics import triton_int8_chain
    monkeypatch.setattr(triton_int8_chain, "smem_limit", lambda device: SMEM)
    fits = triton_int8_chain.fits(CPU)
    assert fits(64, 256, 64, True) and fits(64, 256, 128, True)
    assert not fits(128, 512, 128, True) and not fits(256, 1024, 256, True)


def test_the_measured_winner_is_among_the_configs_the_autotuner_times():
    """The autotuner times the first CONFIGS_PER_TACTIC[3] configs: layer 1's winning chain tile (H100,
    2026-11-24: 64 rows x 128 channels, two programs to an SM) must be among them, and so must a three-per-SM one."""
    from kiln.builder.autotune import CONFIGS_PER_TACTIC
    timed = int8_gemm_chain.configs(200704, 64, 256, 64, SMEM, True)[:CONFIGS_PER_TACTIC[3]]
    assert any((c["BLOCK_M"], c["BLOCK_N"], c["stream"]) == (64, 128, 2) for c in timed)
    assert any(c["stream"] == 3 for c in timed)
