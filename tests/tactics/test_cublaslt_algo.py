"""cublaslt_algo_gemm: FusedGemm through cuBLASLt with an algorithm the autotuner picked. On the CPU: which layers
it takes and how an algorithm travels in a plan; on a GPU: every algorithm the heuristic offers against the
reference (bias, ReLU, GELU; fp16 and bf16), into the planned buffer, at other rows, and in a CUDA graph."""

import gc

import pytest
import torch

from kiln.builder.autotune import TOLERANCE
from kiln.ir import DType
from kiln.kernels import cublaslt
from kiln.kinds import run_reference
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from kiln.target.device import Device

TACTIC = registry.get("cublaslt_algo_gemm")
CPU = Device("cpu", "cpu", "cpu")


def _spec(m: int, k: int, n: int, dtype=torch.float16, activation="none", bias=True, rows=None, const_bias=True,
          device="cpu"):
    """The layer's spec, its weight and bias (constants on `device`, as an engine's are)."""
    g = torch.Generator().manual_seed(0)
    w, b = (torch.randn(n, k, generator=g) * 0.05).to(device, dtype), torch.randn(n, generator=g).to(device, dtype)
    dt = DType.from_torch(dtype)
    attrs = {"trans_b": True, "activation": activation, "activation_params": []}
    x = ValueSpec(dt, (2, rows if rows is not None else m // 2, k))
    inputs = (x, ValueSpec(dt, (n, k), w)) + ((ValueSpec(dt, (n,), b if const_bias else None),) if bias else ())
    return LayerSpec("g", "FusedGemm", attrs, inputs, (ValueSpec(dt, (2, m // 2, n)),)), w, b


def test_takes_half_precision_gemms_with_known_rows_and_cublaslt_epilogues():
    assert TACTIC.supports(_spec(64, 32, 48)[0], CPU) is None
    assert TACTIC.supports(_spec(64, 32, 48, torch.bfloat16, "Relu")[0], CPU) is None
    assert TACTIC.supports(_spec(64, 32, 48, activation="Gelu", bias=False)[0], CPU) is None
    assert "fp16 or bf16" in TACTIC.supports(_spec(64, 32, 48, torch.float32)[0], CPU)
    assert "epilogue" in TACTIC.supports(_spec(64, 32, 48, activation="Sigmoid")[0], CPU)
    assert "rows unknown" in TACTIC.supports(_spec(64, 32, 48, rows="seq")[0], CPU)
    assert "bias" in TACTIC.supports(_spec(64, 32, 48, const_bias=False)[0], CPU)
    assert TACTIC.card_specific and TACTIC.backends == ("cuda",)  # CPU builds never list it


def test_an_algorithm_travels_as_hex_words():
    algo = cublaslt.Algo(tuple(f"{i * 0x1234567:016x}" for i in range(8)), 4)
    config = algo.to_config()
    assert cublaslt.Algo.from_config(config) == algo
    assert list(algo.struct()) == [i * 0x1234567 for i in range(8)]
    for bad in ({"algo": ["00"] * 7}, {"algo": [1] * 8}, {}, config | {"workspace": 1 << 40}):
        with pytest.raises(ValueError):
            cublaslt.Algo.from_config(bad)


CASES = [(256, 128, 384, torch.float16, "none"), (128, 768, 2304, torch.float16, "Gelu"),
         (64, 256, 128, torch.bfloat16, "Relu")]


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n, dtype, activation", CASES)
def test_gpu_every_algorithm_matches_the_reference(m, k, n, dtype, activation):
    spec, w, b = _spec(m, k, n, dtype, activation, device="cuda")
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    x = torch.randn(2, m // 2, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    want = run_reference("FusedGemm", [x.float(), w.float().cpu(), b.float().cpu()], spec.attrs)[0].cuda()
    configs = TACTIC.configs(spec, dev, 3)
    assert configs and len(TACTIC.configs(spec, dev, 1)) == 1
    rtol, atol = TOLERANCE[dtype]
    x = x.cuda()
    for config in configs:
        buf = torch.empty(m * n * 2, dtype=torch.uint8, device="cuda")
        got = TACTIC.compile(spec, config, dev)([x, None, None], [buf])[0]
        assert got.shape == (2, m // 2, n) and got.dtype == dtype
        assert torch.allclose(got.float(), want, rtol=rtol, atol=atol), config
        assert got.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()


@pytest.mark.gpu
def test_gpu_other_rows_and_a_captured_graph():
    spec, w, b = _spec(128, 256, 192, activation="Gelu", device="cuda")
    w, b = w.cpu(), b.cpu()
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    run = TACTIC.compile(spec, TACTIC.configs(spec, dev, 3)[-1], dev)
    rtol, atol = TOLERANCE[torch.float16]
    for shape in ((2, 64, 256), (3, 10, 256)):  # as built, then other rows (torch's call)
        x = torch.randn(*shape, device="cuda").half()
        want = run_reference("FusedGemm", [x.float().cpu(), w.float(), b.float()], spec.attrs)[0].cuda()
        assert torch.allclose(run([x, None, None])[0].float(), want, rtol=rtol, atol=atol)
    x = torch.randn(2, 64, 256, device="cuda").half()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run([x, None, None])  # the stream's workspace, made outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = run([x, None, None])[0]
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    want = run_reference("FusedGemm", [x.float().cpu(), w.float(), b.float()], spec.attrs)[0].cuda()
    assert torch.allclose(y.float(), want, rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_gpu_a_foreign_algorithm_is_refused():
    spec = _spec(64, 32, 48, device="cuda")[0]
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    with pytest.raises(RuntimeError, match="cuBLASLt"):
        TACTIC.compile(spec, {"algo": ["ffffffffffffffff"] * 8, "workspace": 0}, dev)
    gc.collect()  # the refused GEMM's descriptors are freed by its finalizer, which must not fail
    assert TACTIC.configs(spec, dev, 1)  # cuBLASLt still answers afterwards
