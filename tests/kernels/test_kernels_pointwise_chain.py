"""The generated PointwiseChain kernel (kernels/pointwise_chain.py, tactic triton_pointwise_chain) against the
chain's reference: chains made by fuse_pointwise_chain from small ONNX graphs, run on the CPU interpreter without a
GPU. fp32 chains agree to a few ulps (the kernel's exp-based tanh and sigmoid), half ones within the autotuner's
tolerance, masks, comparisons and broadcast constants exactly."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from onnx import TensorProto as T, helper, numpy_helper  # noqa: E402

from kiln.builder.autotune import TOLERANCE  # noqa: E402
from kiln.frontend.onnx import import_onnx  # noqa: E402
from kiln.passes import PassContext, run_passes  # noqa: E402
from kiln.passes.fuse_pointwise_chain import fuse_pointwise_chain  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import layer_spec  # noqa: E402

CPU = Device("cpu", "cpu", "cpu")
SHAPE = [2, 3, 37]
TOL = {**TOLERANCE, torch.float32: (1e-5, 1e-6)}


def _chain(nodes, inputs, output, inits=()):
    """The PointwiseChain layer (and its network) fuse_pointwise_chain makes of `nodes`."""
    g = helper.make_graph(nodes, "g", inputs, [output], initializer=list(inits))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    net = import_onnx(onnx.shape_inference.infer_shapes(model))
    run_passes(net, [fuse_pointwise_chain], PassContext())
    (layer,) = [l for l in net.layers if l.kind == "PointwiseChain"]
    return net, layer


def _run(net, layer, feeds: dict[str, torch.Tensor], config=None):
    """(the tactic's output, the reference's) on `feeds`."""
    spec = layer_spec(net, layer, {k: v for k, v in net.constants.items()})
    tactic = registry.get("triton_pointwise_chain")
    assert tactic.supports(spec, CPU) is None, tactic.supports(spec, CPU)
    inputs = [feeds[n] if n in feeds else net.constants[n] for n in layer.inputs]
    got = tactic.compile(spec, config or tactic.configs(spec, CPU, 0)[0], CPU)(inputs)[0]
    want = registry.reference_kernel(spec)(inputs)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    return got, want


@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16])
def test_arithmetic_and_activations(dtype):
    """z = HardSigmoid(Tanh(x · 2 + y) - LeakyRelu(y)) with a scalar constant, two inputs and two attributed steps."""
    np_dtype = np.float32 if dtype == T.FLOAT else np.float16
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Add", ["a", "y"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("LeakyRelu", ["y"], ["d"], alpha=0.2),
             helper.make_node("Sub", ["c", "d"], ["e"]),
             helper.make_node("HardSigmoid", ["e"], ["z"], alpha=0.3, beta=0.4)]
    net, layer = _chain(nodes, [helper.make_tensor_value_info(n, dtype, SHAPE) for n in ("x", "y")],
                        helper.make_tensor_value_info("z", dtype, SHAPE),
                        [numpy_helper.from_array(np.array(2.0, np_dtype), "two")])
    assert len(layer.attrs["program"]) == 6
    g = torch.Generator().manual_seed(0)
    feeds = {n: torch.randn(SHAPE, generator=g).to(torch.float32 if dtype == T.FLOAT else torch.float16)
             for n in ("x", "y")}
    for config in ({"BLOCK": 64, "num_warps": 2}, None):  # several programs, and the default one block
        got, want = _run(net, layer, feeds, config)
        rtol, atol = TOL[want.dtype]
        torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def test_a_padding_mask_exactly():
    """BERT's mask: int64 → Cast bool → Where(·, 0, -65504) in fp16: bit-exact."""
    nodes = [helper.make_node("Cast", ["m"], ["c"], to=T.BOOL), helper.make_node("Where", ["c", "zero", "low"], ["z"])]
    net, layer = _chain(nodes, [helper.make_tensor_value_info("m", T.INT64, SHAPE)],
                        helper.make_tensor_value_info("z", T.FLOAT16, SHAPE),
                        [numpy_helper.from_array(np.array(0, np.float16), "zero"),
                         numpy_helper.from_array(np.array(-65504, np.float16), "low")])
    m = torch.randint(-1, 2, SHAPE, generator=torch.Generator().manual_seed(1))
    got, want = _run(net, layer, {"m": m})
    assert torch.equal(got, want) and (got == -65504).any() and (got == 0).any()


def test_comparisons_logic_and_clip():
    """z = Where(x < 0.5 And Not(x > y), Clip(x, -1, 1), y / 3): exact selections, fp32 arithmetic."""
    nodes = [helper.make_node("Less", ["x", "half"], ["l"]), helper.make_node("Greater", ["x", "y"], ["gt"]),
             helper.make_node("Not", ["gt"], ["ng"]), helper.make_node("And", ["l", "ng"], ["cond"]),
             helper.make_node("Clip", ["x", "lo", "hi"], ["cl"]), helper.make_node("Div", ["y", "three"], ["d"]),
             helper.make_node("Where", ["cond", "cl", "d"], ["z"])]
    consts = {"half": 0.5, "lo": -1.0, "hi": 1.0, "three": 3.0}
    net, layer = _chain(nodes, [helper.make_tensor_value_info(n, T.FLOAT, SHAPE) for n in ("x", "y")],
                        helper.make_tensor_value_info("z", T.FLOAT, SHAPE),
                        [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()])
    g = torch.Generator().manual_seed(2)
    got, want = _run(net, layer, {n: torch.randn(SHAPE, generator=g) * 2 for n in ("x", "y")})
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("w_shape", [(3, 1), (37,), (2, 1, 1)])
def test_constants_that_broadcast(w_shape):
    """z = Relu(x · w + 1) with w per channel, per position or per batch: read through its broadcast strides."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["a"]), helper.make_node("Add", ["a", "one"], ["b"]),
             helper.make_node("Relu", ["b"], ["z"])]
    w = np.random.default_rng(3).normal(size=w_shape).astype(np.float32)
    net, layer = _chain(nodes, [helper.make_tensor_value_info("x", T.FLOAT, SHAPE)],
                        helper.make_tensor_value_info("z", T.FLOAT, SHAPE),
                        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    got, want = _run(net, layer, {"x": torch.randn(SHAPE, generator=torch.Generator().manual_seed(4))},
                     {"BLOCK": 64, "num_warps": 2})
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_refuses_steps_without_a_generated_form():
    tactic = registry.get("triton_pointwise_chain")
    nodes = [helper.make_node("Round", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["z"])]
    net, layer = _chain(nodes, [helper.make_tensor_value_info("x", T.FLOAT, SHAPE)],
                        helper.make_tensor_value_info("z", T.FLOAT, SHAPE))
    assert "Round" in tactic.supports(layer_spec(net, layer, dict(net.constants)), CPU)


@pytest.mark.gpu
def test_gpu_mask_and_activation_chains():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    nodes = [helper.make_node("Cast", ["m"], ["c"], to=T.BOOL), helper.make_node("Where", ["c", "zero", "low"], ["z"])]
    net, layer = _chain(nodes, [helper.make_tensor_value_info("m", T.INT64, [64, 128])],
                        helper.make_tensor_value_info("z", T.FLOAT16, [64, 128]),
                        [numpy_helper.from_array(np.array(0, np.float16), "zero"),
                         numpy_helper.from_array(np.array(-65504, np.float16), "low")])
    net.constants = {k: v.cuda() for k, v in net.constants.items()}
    device = Device("cuda", torch.cuda.get_device_name(0), "cuda")
    spec = layer_spec(net, layer, dict(net.constants))
    tactic = registry.get("triton_pointwise_chain")
    assert tactic.supports(spec, device) is None
    m = torch.randint(0, 2, (64, 128), device="cuda")
    inputs = [m if n == "m" else net.constants[n] for n in layer.inputs]
    want = registry.reference_kernel(spec)(inputs)[0]
    for config in tactic.configs(spec, device, 5):
        assert torch.equal(tactic.compile(spec, config, device)(inputs)[0], want)


UNARY = ["Neg", "Abs", "Exp", "Sqrt", "Tanh", "Sigmoid", "Relu", "Erf", "Floor", "Reciprocal", "Softsign"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min"]


def _random_chain(seed: int, dtype):
    """A random tree of 4-7 elementwise steps over x, y and a scalar constant, each intermediate read once (so that
    the pass makes one chain); values kept finite: Sqrt, Reciprocal and Div read Abs(v) + 1."""
    rng = np.random.default_rng(seed)
    np_dtype = np.float32 if dtype == T.FLOAT else np.float16
    pool, nodes = [], []  # intermediates not read yet

    def take() -> str:
        if pool and rng.random() < 0.7:
            return pool.pop(int(rng.integers(len(pool))))
        return str(rng.choice(["x", "y"]))

    def positive(i: int, a: str) -> str:
        nodes.extend([helper.make_node("Abs", [a], [f"abs{i}"]),
                      helper.make_node("Add", [f"abs{i}", "one"], [f"p{i}"])])
        return f"p{i}"

    for i in range(int(rng.integers(4, 8))):
        op, out = str(rng.choice(UNARY + BINARY)), f"v{i}"
        if op in ("Sqrt", "Reciprocal"):
            nodes.append(helper.make_node(op, [positive(i, take())], [out]))
        elif op == "Div":
            a = take()
            nodes.append(helper.make_node("Div", [a, positive(i, take())], [out]))
        elif op in BINARY:
            nodes.append(helper.make_node(op, [take(), "k" if rng.random() < 0.3 else take()], [out]))
        else:
            nodes.append(helper.make_node(op, [take()], [out]))
        pool.append(out)
    while len(pool) > 1:
        a, b = pool.pop(), pool.pop()
        nodes.append(helper.make_node("Add", [a, b], [f"s{len(pool)}"]))
        pool.append(f"s{len(pool)}")
    nodes.append(helper.make_node("Tanh", [pool[0]], ["z"]))
    consts = [numpy_helper.from_array(np.array(v, np_dtype), k) for k, v in (("k", 0.75), ("one", 1.0))]
    return _chain(nodes, [helper.make_tensor_value_info(n, dtype, SHAPE) for n in ("x", "y")],
                  helper.make_tensor_value_info("z", dtype, SHAPE), consts)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16])
def test_random_chains(seed, dtype):
    """Random trees of arithmetic and activations agree with the reference step by step (each float step rounded to
    the reference's dtype)."""
    net, layer = _random_chain(seed, dtype)
    g = torch.Generator().manual_seed(seed)
    torch_dtype = torch.float32 if dtype == T.FLOAT else torch.float16
    got, want = _run(net, layer, {n: torch.randn(SHAPE, generator=g).to(torch_dtype) for n in ("x", "y")})
    rtol, atol = TOL[want.dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, equal_nan=True)


COMPILE = """
import torch, triton
from triton.backends.compiler import GPUTarget
from kiln.kernels import pointwise_chain as pc
from kiln.ir import DType
programs = [  # a padding mask; a broadcast constant, an activation and a comparison
    ([["Cast", [0], ["to", DType.BOOL]], ["Where", [3, 1, 2], []]],
     [torch.int64, torch.float16, torch.float16, torch.bool, torch.float16], ["full", "scalar", "scalar"]),
    ([["Mul", [0, 1], []], ["LeakyRelu", [3], ["alpha", 0.2]], ["Less", [4, 2], []], ["Where", [5, 4, 2], []]],
     [torch.float16, torch.float32, torch.float32, torch.float32, torch.float32, torch.bool, torch.float32],
     ["full", "broadcast", "scalar"]),
]
for k, (program, dtypes, forms) in enumerate(programs):
    name = f"chain_{k}"
    fn = pc._kernel(pc.source(program, dtypes, forms, 2, name), name)
    ty = {torch.float32: "fp32", torch.float16: "fp16", torch.int64: "i64", torch.bool: "i1"}
    sig, consts = {}, {"BLOCK": 1024, "PDL": True}
    for p in fn.arg_names:
        if p[0] == "x" and "_s" not in p:
            sig[p] = "*" + ty[dtypes[int(p[1:])]]
        elif p == "y":
            sig[p] = "*" + ty[dtypes[-1]]
        elif p.startswith("ACT"):
            consts[p] = "leaky_relu"
        elif p[0] in "ab" and p[1:].isdigit():
            sig[p] = "fp32"
        elif p not in consts:
            sig[p] = "i64"
    sig.update({c: "constexpr" for c in consts})
    compiled = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts),
                              target=GPUTarget("cuda", 90, 32))
    assert "ptx" in compiled.asm, compiled.asm.keys()
print("compiled", len(programs))
"""


def test_generated_source_compiles_for_hopper():
    """The interpreter takes what the compiler may not: the generated source of a mask chain and of a broadcast,
    activation and comparison chain compiles to PTX for sm_90 (no GPU needed), PDL on, in a process of its own
    (this one's kernels are the interpreter's)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2] / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled 2" in done.stdout, done.stderr[-2000:]
