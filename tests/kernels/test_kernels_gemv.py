"""triton_gemv (Gemm / MatMul / FusedGemm of at most gemv.MAX_ROWS rows) against their references.

On the CPU the kernel runs under TRITON_INTERPRET=1 at small shapes; the gpu test runs the suite's classifier and
pooler shapes at batch 1.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.kernels import gemv  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.target.device import Device  # noqa: E402

from test_kernels_gemm import _check, _spec  # noqa: E402  (the GEMM tests' spec and tolerance check)

CPU = Device("cpu", "cpu", "cpu")
TACTIC = registry.get("triton_gemv")
SMALL = {"BLOCK_N": 4, "BLOCK_K": 16, "num_warps": 1}  # 37 columns and 50 of K cut both blocks


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("trans_a, trans_b", [(0, 1), (1, 0)])
def test_gemm_alpha_beta_c(dtype, m, trans_a, trans_b):
    """ONNX Gemm: alpha · A' @ B' + beta · C with C one row ([N] or [1, N]), either operand transposed."""
    g = _gen(m)
    a = torch.randn(*((50, m) if trans_a else (m, 50)), generator=g).to(dtype)
    b = torch.randn(*((37, 50) if trans_b else (50, 37)), generator=g).to(dtype)
    c = torch.randn(*((37,) if m == 1 else (1, 37)), generator=g).to(dtype)
    attrs = {"alpha": 0.5, "beta": 2.0, "transA": trans_a, "transB": trans_b}
    spec, want = _spec("Gemm", attrs, [a, b, c], {1, 2})
    assert TACTIC.supports(spec, CPU) is None
    _check(TACTIC.compile(spec, SMALL, CPU)([a, b, c])[0], want[0])


@pytest.mark.parametrize("act, params", [("none", []), ("Tanh", []), ("Relu", []), ("Gelu", []),
                                         ("Clip", [None, 0.5])])
@pytest.mark.parametrize("trans_b", [False, True])
def test_fused_gemm_activations(act, params, trans_b):
    """FusedGemm of an N-D left operand ([1, 2, K]: two rows), bias and each activation (BERT's pooler: Tanh)."""
    g = _gen(1)
    x = torch.randn(1, 2, 40, generator=g).half()
    w = torch.randn(*((24, 40) if trans_b else (40, 24)), generator=g).half() * 0.2
    bias = torch.randn(24, generator=g).half()
    attrs = {"trans_b": trans_b, "activation": act, "activation_params": params}
    spec, want = _spec("FusedGemm", attrs, [x, w, bias], {1, 2})
    assert TACTIC.supports(spec, CPU) is None
    _check(TACTIC.compile(spec, SMALL, CPU)([x, w, bias])[0], want[0])


def test_matmul_every_config_at_level_4():
    g = _gen(2)
    x, w = torch.randn(1, 2100, generator=g), torch.randn(2100, 70, generator=g)
    spec, want = _spec("MatMul", {}, [x, w], {1})
    configs = TACTIC.configs(spec, CPU, 4)
    assert len(configs) > len(TACTIC.configs(spec, CPU, 3)) == 4
    for config in configs:
        _check(TACTIC.compile(spec, config, CPU)([x, w])[0], want[0])


def test_out_buffer_is_written():
    g = _gen(3)
    x, w = torch.randn(2, 20, generator=g), torch.randn(20, 12, generator=g)
    spec, want = _spec("MatMul", {}, [x, w], {1})
    out = torch.empty(2 * 12 * 4, dtype=torch.uint8)
    got = TACTIC.compile(spec, SMALL, CPU)([x, w], [out])[0]
    assert got.data_ptr() == out.data_ptr()
    _check(got, want[0])


def test_refusals():
    g = _gen(4)
    many, w = torch.randn(gemv.MAX_ROWS + 1, 16, generator=g), torch.randn(16, 8, generator=g)
    assert "rows" in TACTIC.supports(_spec("MatMul", {}, [many, w], {1})[0], CPU)
    x, c = torch.randn(2, 16, generator=g), torch.randn(2, 8, generator=g)
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
    assert "one row" in TACTIC.supports(_spec("Gemm", attrs, [x, w, c], {1})[0], CPU)
    one, scalar = torch.randn(16, 1, generator=g), torch.tensor(0.5)  # one output column, a scalar C
    assert "one row" in TACTIC.supports(_spec("Gemm", attrs, [x, one, scalar], {1})[0], CPU)
    with pytest.raises(ValueError, match="rows"):
        gemv.gemv(many, w.t().contiguous())


@pytest.mark.gpu
@pytest.mark.parametrize("k, n, act", [(2048, 1000, "none"), (1280, 1000, "none"), (768, 1000, "none"),
                                       (768, 768, "Tanh")])
def test_gpu_classifier_shapes_every_config(k, n, act):
    """ResNet-50's, MobileNetV2's and ViT's classifiers and BERT's pooler at batch 1, fp16, every config of level 4."""
    x = torch.randn(1, k, device="cuda").half()
    w, bias = (torch.randn(n, k, device="cuda") * k ** -0.5).half(), torch.randn(n, device="cuda").half()
    attrs = {"trans_b": True, "activation": act, "activation_params": []}
    spec, want = _spec("FusedGemm", attrs, [x, w, bias], {1, 2})
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    assert TACTIC.supports(spec, dev) is None
    for config in TACTIC.configs(spec, dev, 4):
        _check(TACTIC.compile(spec, config, dev)([x, w, bias])[0], want[0])
