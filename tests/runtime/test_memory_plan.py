"""The memory plan (runtime/memory_plan.py) and the activation arena (runtime/arena.py): planned offsets never
overlap while their storage can be read (views included), kernels that take output buffers write at their
offsets, and engines running from the arena give the reference engine's results, run after run."""

import os

import numpy as np
import pytest
import torch

import kiln
from kiln.tactics.choice import Choice
from kiln.target.device import Device, detect
from kiln.runtime import Engine
from kiln.ir import DType, Layer, Network
from kiln.runtime.memory_plan import plan_memory
from kiln.tactics import registry
from kiln.tactics.spec import layer_spec


CPU = Device("cpu", "cpu", "cpu")
# engines run where Triton does: the CPU through the interpreter (CI), else the GPU
ON = CPU if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available() else detect("cuda")
CONFIG = kiln.BuildConfig(device=ON.backend)
GPU_LIKE = Device("cuda", "test", "cuda")  # candidates() reads only the backend; nothing touches a GPU
F32 = DType.FLOAT32


def _overlap(plan, a, b) -> bool:
    (oa, sa), (ob, sb) = (plan.offsets[a], plan.sizes[a]), (plan.offsets[b], plan.sizes[b])
    return oa < ob + sb and ob < oa + sa


def _view_net() -> Network:
    """x → Relu a → Reshape v (a view of a) …  Sigmoid b, Tanh c (born after a's last direct reader) … Add(v, c)."""
    net = Network("n")
    net.add_tensor("x", F32, (4, 8))
    net.inputs = ["x"]
    net.add_constant("s", torch.tensor([8, 4]))
    for name, shape in (("a", (4, 8)), ("v", (8, 4)), ("b", (4, 8)), ("c", (8, 4)), ("y", (8, 4))):
        net.add_tensor(name, F32, shape)
    net.layers = [Layer("l0", "Relu", ["x"], ["a"]), Layer("l1", "Reshape", ["a", "s"], ["v"]),
                  Layer("l2", "Sigmoid", ["x"], ["b"]), Layer("l3", "Reshape", ["b", "s"], ["c0"]),
                  Layer("l4", "Tanh", ["c0"], ["c"]), Layer("l5", "Add", ["v", "c"], ["y"])]
    net.add_tensor("c0", F32, (8, 4))
    net.outputs = ["y"]
    return net


def test_views_keep_their_source_alive_in_the_arena():
    net = _view_net()
    placed = {"l0", "l2", "l4"}
    plan = plan_memory(net, placed=placed, fresh=placed)
    assert set(plan.offsets) == {"a", "b", "c"}
    assert _overlap(plan, "a", "b") is False and _overlap(plan, "a", "c") is False  # v (a's view) read at l5
    # without knowing l1 makes a view, a dies at l1 and b may take its bytes: the hazard the plan avoids
    naive = plan_memory(net, placed=placed, fresh=placed | {"l1", "l3"})
    assert _overlap(naive, "a", "b") or _overlap(naive, "a", "c")


def test_disjoint_lifetimes_share_bytes_and_outputs_stay_out():
    net = Network("chain")
    net.add_tensor("x", F32, (64,))
    net.inputs = ["x"]
    names = ["t0", "t1", "t2", "t3", "y"]
    for n in names:
        net.add_tensor(n, F32, (64,))
    net.layers = [Layer(f"l{i}", "Relu", ["x" if i == 0 else names[i - 1]], [n]) for i, n in enumerate(names)]
    net.outputs = ["y"]
    plan = plan_memory(net, placed={l.name for l in net.layers}, fresh={l.name for l in net.layers})
    assert "y" not in plan.offsets and set(plan.offsets) == {"t0", "t1", "t2", "t3"}
    assert plan.offsets["t0"] == plan.offsets["t2"] and plan.arena_bytes == 2 * 256  # ping-pong of two buffers
    assert plan.unplaced == 0


def test_a_view_of_the_arena_that_is_a_network_output_is_copied_out():
    net = _view_net()
    net.outputs = ["v", "y"]
    ref = Engine(net, CONFIG, ON)
    eng = _forced(ref, {"triton_pointwise", "view_reshape"})
    assert "a" in eng.memory_plan.offsets
    ctx = eng.create_context()
    x = torch.randn(4, 8, device=ON.torch_device)
    first = ctx.run({"x": x})
    assert not _inside(first["v"], ctx.arena.block)
    ctx.run({"x": -x})
    torch.testing.assert_close(first["v"], torch.relu(x).reshape(8, 4))


def test_dynamic_shapes_have_no_arena():
    net = _view_net()
    net.tensors["b"].shape = ("n", 8)
    plan = plan_memory(net, placed={"l0", "l2", "l4"})
    assert plan.arena_bytes is None and not plan.offsets


def _forced(engine, allowed) -> Engine:
    """The engine with every layer on the best-priority tactic among `allowed` that supports it."""
    choices = {}
    for layer in engine.network.layers:
        spec = layer_spec(engine.network, layer, engine.weights)
        ok, _ = registry.candidates(spec, GPU_LIKE)
        for t in ok:
            if t.name in allowed:
                choices[layer.name] = Choice(t.name, t.configs(spec, GPU_LIKE, 1)[0])
                break
    return Engine(engine.network, engine.config, engine.device, tactics=choices)


def _named(*prefixes: str) -> set[str]:
    """Every registered tactic whose name starts with one of `prefixes` (the tactic modules loaded first)."""
    registry.get(registry.REFERENCE)  # loads the tactic library
    return {t for t in registry.TACTICS if t.startswith(prefixes)}


def _inside(t: torch.Tensor, block: torch.Tensor) -> bool:
    start = block.data_ptr()
    return start <= t.data_ptr() < start + block.numel()


def test_view_chain_engine_runs_from_the_arena():
    net = _view_net()
    ref = Engine(net, CONFIG, ON)
    eng = _forced(ref, {"triton_pointwise", "view_reshape"})
    assert {eng.tactics[n].tactic for n in ("l0", "l2", "l4")} == {"triton_pointwise"}
    assert eng.tactics["l1"].tactic == "view_reshape"
    ctx = eng.create_context()
    assert ctx.arena.nbytes == eng.memory_plan.arena_bytes > 0
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
        np.testing.assert_allclose(ctx.run({"x": x})["y"], ref.run({"x": x})["y"], rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from test_views import _bert_onnx

    return _bert_onnx(tmp_path_factory.mktemp("bert"))


def test_bert_engine_places_its_activations_and_matches_the_reference(tiny_bert):
    """Every GEMM, LayerNorm and attention layer writes into the arena; results equal the reference engine's
    run after run, outputs are not arena memory, and kept intermediates (compare --mark-all) are right."""
    path, feeds = tiny_bert
    ref = kiln.build(str(path), CONFIG)
    allowed = _named("triton_", "view_") | {"cublaslt_fused_gemm", "cublas_matmul"}
    eng = _forced(ref, allowed - {"triton_fused_attention", "triton_flash_attention"})
    placed = [n for n, t in eng.compiled.items() if t.writes_out]
    plan = eng.memory_plan
    assert len(placed) >= 10 and len(plan.offsets) >= 10 and plan.arena_bytes > 0
    ctx = eng.create_context()
    want = ref.run(feeds)
    for _ in range(2):
        got = ctx.run({k: torch.from_numpy(v) for k, v in feeds.items()})
        for k in want:
            np.testing.assert_allclose(got[k].cpu().numpy(), want[k], rtol=1e-4, atol=1e-4)
            assert not _inside(got[k], ctx.arena.block)
    layer = next(l for l in eng.network.layers if l.name in placed)
    kept = ctx.run(feeds, keep={layer.outputs[0]})
    ref_kept = ref.create_context().run(feeds, keep={layer.outputs[0]})
    np.testing.assert_allclose(kept[layer.outputs[0]], ref_kept[layer.outputs[0]], rtol=1e-4, atol=1e-4)


def test_kernels_write_where_the_arena_says():
    """A kernel handed a buffer returns a view of that buffer (channels_last conv included)."""
    from kiln.kernels import conv, gemm

    dev = ON.torch_device
    buf = torch.zeros(4096, dtype=torch.uint8, device=dev)
    a, w = torch.randn(8, 16, device=dev), torch.randn(16, 8, device=dev)
    y = gemm.matmul(a, w, config={"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4,
                                  "num_stages": 1}, out=buf[256:])
    assert y.data_ptr() == buf[256:].data_ptr()
    torch.testing.assert_close(y, a @ w, rtol=1e-3, atol=1e-3)  # TF32-free fp32 on both; order differs
    x, k = torch.randn(1, 4, 5, 5, device=dev), torch.randn(6, 4, 3, 3, device=dev)
    y = conv.conv2d(x, conv.pack_weight(k), (3, 3), (1, 1), [1, 1, 1, 1], (1, 1), out=buf)
    assert y.data_ptr() == buf.data_ptr() and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, torch.nn.functional.conv2d(x, k, padding=1), rtol=1e-3, atol=1e-3)
    with pytest.raises(kiln.errors.InternalError, match="too small"):
        gemm.matmul(a, w, out=buf[:64])


@pytest.mark.parametrize("quant", ["int8", "fp8"])
def test_quantized_engine_runs_from_the_arena(tmp_path, quant):
    """int8 / fp8 convs, GEMMs and QuantizeLinear layers write into the arena; run after run, the engine gives
    the reference engine's result (int8 exactly: integer sums; fp8 within its float accumulation)."""
    from test_quant_fp8 import _cnn

    path, x = _cnn(tmp_path)
    x = x[:4]
    config = kiln.BuildConfig.with_shapes({"x": x.shape}, device=ON.backend, calib=str(tmp_path / "calib.npz"),
                                          calibrator="minmax", **{quant: True})
    ref = kiln.build(path, config)
    eng = _forced(ref, _named("triton_", "view_"))
    placed = {eng.compiled[n].name for n in eng.compiled if eng.compiled[n].writes_out}
    assert {f"triton_{quant}_conv", "triton_quantize"} <= placed, placed
    assert eng.memory_plan.arena_bytes > 0 and len(eng.memory_plan.offsets) >= 4
    want = ref.run({"x": x})["y"]
    ctx = eng.create_context()
    for _ in range(2):
        got = ctx.run({"x": x})["y"]
        if quant == "int8":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05 * np.abs(want).max())
