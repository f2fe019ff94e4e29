"""quant/int8.py runs a MaxPool between quantized convs on the quantized type: the conv before it requantizes with
the pool output's scale and the pool reads and writes int8 / fp8 (ResNet's stem → MaxPool → first block), so no
QuantizeLinear follows the pool. Max commutes with quantizing, so the engine stays as close to fp32 as before."""

import numpy as np
import pytest
import torch

import kiln
from kiln.ir import DType
from models.export import export
from test_memory_plan import _forced, _named
from test_quant_int8_residual import _cosine

BATCH = 4


def _stem_net(tmp_path, pool_is_output=False):
    torch.manual_seed(0)

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.pool = torch.nn.Conv2d(3, 16, 5, 2, 2), torch.nn.MaxPool2d(3, 2, 1)
            self.conv, self.fc = torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.Linear(16, 10)

        def forward(self, x):
            p = self.pool(torch.relu(self.stem(x)))
            y = self.fc(torch.relu(self.conv(p)).mean((2, 3)))
            return (y, p) if pool_is_output else y

    outputs = ["y", "p"] if pool_is_output else ["y"]
    path = export(Stem(), (torch.randn(2, 3, 16, 16),), tmp_path / "stem.onnx", dynamo=False, input_names=["x"],
                  output_names=outputs, dynamic_axes={"x": {0: "b"}})
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.normal(size=(32, 3, 16, 16)).astype(np.float32))
    return path, rng.normal(size=(BATCH, 3, 16, 16)).astype(np.float32)


def _build(tmp_path, pool_is_output=False, **config):
    path, x = _stem_net(tmp_path, pool_is_output)
    cfg = kiln.BuildConfig.with_shapes({"x": x.shape}, device="cpu", calib=str(tmp_path / "calib.npz"),
                                       calibrator="minmax", **config)
    fp32 = kiln.build(path, kiln.BuildConfig.with_shapes({"x": x.shape}, device="cpu"))
    return kiln.build(path, cfg), fp32, x


@pytest.mark.parametrize("flag,dtype,cosine", [("int8", DType.INT8, 0.999), ("fp8", DType.FP8E4M3, 0.995)])
def test_max_pool_between_quantized_convs_runs_quantized(tmp_path, flag, dtype, cosine):
    engine, fp32, x = _build(tmp_path, **{flag: True})
    net = engine.network
    pool = next(la for la in net.layers if la.kind == "MaxPool")
    stem = net.producers()[pool.inputs[0]]
    assert stem.kind == "QuantConv" and net.tensors[pool.inputs[0]].dtype is dtype
    assert net.tensors[pool.outputs[0]].dtype is dtype
    reader = next(la for la in net.layers if la.kind == "QuantConv" and la.inputs[0] == pool.outputs[0])
    assert stem.attrs["out_scale"] == reader.attrs["x_scale"]  # the stem requantizes with the pool output's scale
    # QuantizeLinear only for x and the pooled features the Linear reads (was 3: one more after the pool)
    assert [la.inputs[0] for la in net.layers if la.kind == "QuantizeLinear"][0] == "x"
    assert sum(la.kind == "QuantizeLinear" for la in net.layers) == 2
    assert engine.build_info["int8"]["layers"][stem.name]["output"] == flag
    assert _cosine(engine.run({"x": x})["y"], fp32.run({"x": x})["y"]) >= cosine


def test_quantized_pool_engine_on_triton_matches_the_reference_bit_exactly(tmp_path):
    ref, _, x = _build(tmp_path, int8=True)
    eng = _forced(ref, _named("triton_int8_conv", "triton_int8_gemm", "triton_quantize", "triton_pool", "view_",
                              "torch_global"))
    pool = next(la.name for la in eng.network.layers if la.kind == "MaxPool")
    assert eng.tactics[pool].tactic == "triton_pool"
    np.testing.assert_array_equal(eng.run({"x": x})["y"], ref.run({"x": x})["y"])


def test_a_pool_that_is_a_network_output_stays_float(tmp_path):
    engine, fp32, x = _build(tmp_path, pool_is_output=True, int8=True)
    net = engine.network
    pool = next(la for la in net.layers if la.kind == "MaxPool")
    assert net.tensors[pool.outputs[0]].dtype is DType.FLOAT32 and net.tensors[pool.inputs[0]].dtype is DType.FLOAT32
    assert sum(la.kind == "QuantizeLinear" for la in net.layers) == 3
    np.testing.assert_allclose(engine.run({"x": x})["p"], fp32.run({"x": x})["p"], atol=0.05, rtol=0.05)


def test_stem_on_the_space_to_depth_tactic_matches_the_reference_bit_exactly(tmp_path):
    """The stem conv (5x5/2 on 3 channels) through triton_int8_conv_s2d (two tiles), the rest through the Triton
    tactics: the reference engine's bits."""
    from kiln.tactics.choice import Choice
    from kiln.runtime import Engine
    from kiln.tactics import registry
    from kiln.tactics.spec import layer_spec
    from test_memory_plan import GPU_LIKE
    ref, _, x = _build(tmp_path, int8=True)
    base = _forced(ref, _named("triton_int8_conv", "triton_int8_gemm", "triton_quantize", "triton_pool", "view_",
                               "torch_global"))
    net = ref.network
    stem = next(la for la in net.layers if la.kind == "QuantConv")
    t = registry.get("triton_int8_conv_s2d")
    spec = layer_spec(net, stem, ref.weights)
    assert t.supports(spec, GPU_LIKE) is None
    for cfg in t.configs(spec, GPU_LIKE, 2)[:2]:
        eng = Engine(net, ref.config, ref.device, tactics=dict(base.tactics) | {stem.name: Choice(t.name, cfg)})
        np.testing.assert_array_equal(eng.run({"x": x})["y"], ref.run({"x": x})["y"])
