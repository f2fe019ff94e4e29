"""Triton LayerNorm and Softmax row kernels and their tactics against the LayerNormalization / Softmax references.

Both paths are covered: the whole row in one block, and chunked rows (a 16-wide block over 50 values).
Tolerances: fp32 1e-5 (fp32 statistics like the reference); fp16 / bf16 the autotuner's (the output
is rounded once in the half type, the reference may round one ulp the other way).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.builder.autotune import TOLERANCE, _close, used_outputs  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.ir import DType  # noqa: E402
from kiln.kernels import common, layernorm, softmax  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402

TOL = {**TOLERANCE, torch.float32: (1e-5, 1e-5)}
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter: -inf - -inf
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CPU = Device("cpu", "cpu", "cpu")
CHUNKED = {"BLOCK": 16, "num_warps": 1}
LN = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}


def _spec(kind, attrs, inputs, consts=(), outputs=1):
    """The LayerSpec of a layer with these inputs (indices in `consts` are constants); its first `outputs`
    reference outputs are requested, the rest are not (dtype None)."""
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape), t if i in consts else None)
                 for i, t in enumerate(inputs))
    want = run_reference(kind, inputs, attrs)
    outs = [ValueSpec(DType.from_torch(w.dtype), tuple(w.shape)) if i < outputs else ValueSpec(None, None)
            for i, w in enumerate(want)]
    return LayerSpec("l", kind, attrs, vals, tuple(outs)), want


def _check(got, want):
    rtol, atol = TOL[want.dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [None, CHUNKED])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_kernel(dtype, config, bias):
    x = (torch.randn(3, 5, 50) * 3 + 1).to(dtype)
    w, b = torch.randn(50).to(dtype), torch.randn(50).to(dtype) if bias else None
    want = run_reference("LayerNormalization", [x, w, b], LN)[0]
    _check(layernorm.layer_norm(x, w, b, 1e-5, config), want)


def test_layernorm_strided_rows_and_empty_input():
    x = torch.randn(7, 64)[:, :50]  # rows 64 apart
    w, b = torch.randn(50), torch.randn(50)
    _check(layernorm.layer_norm(x, w, b, 1e-5), run_reference("LayerNormalization", [x, w, b], LN)[0])
    assert layernorm.layer_norm(torch.randn(0, 50), w, b, 1e-5).shape == (0, 50)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_tactic(dtype):
    inputs = [torch.randn(2, 4, 24).to(dtype), torch.randn(1, 24).to(dtype), torch.randn(24).to(dtype)]
    spec, want = _spec("LayerNormalization", {**LN, "epsilon": 1e-3}, inputs, consts={1, 2})
    tactic = registry.get("triton_layernorm")
    assert tactic.supports(spec, CPU) is None
    for config in tactic.configs(spec, CPU, 3):
        _check(tactic.compile(spec, config, CPU)(inputs)[0], want[0])


def test_layernorm_supports_reasons():
    x, w = torch.randn(2, 4, 6), torch.randn(6)
    tactic = registry.get("triton_layernorm")
    assert "Mean" in tactic.supports(_spec("LayerNormalization", LN, [x, w], outputs=3)[0], CPU)
    assert "last dim" in tactic.supports(_spec("LayerNormalization", {**LN, "axis": 1}, [x, torch.randn(4, 6)])[0], CPU)
    assert "stash_type" in tactic.supports(_spec("LayerNormalization", {**LN, "stash_type": 11}, [x, w])[0], CPU)
    assert "scale" in tactic.supports(_spec("LayerNormalization", LN, [x, torch.randn(4, 6)])[0], CPU)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [None, CHUNKED])
def test_softmax_kernel(dtype, config):
    """Large logits, a row with a -inf prefix (chunked path: whole -inf chunks), an all -inf row (NaN, like torch)."""
    x = (torch.randn(4, 3, 50) * 20).to(dtype)
    x[0, 1, :20] = float("-inf")
    x[1, 2, :] = float("-inf")
    _check(softmax.softmax(x, config), run_reference("Softmax", [x], {"axis": -1})[0])


@pytest.mark.parametrize("axis", [-1, 2])
def test_softmax_tactic(axis):
    inputs = [torch.randn(2, 3, 40)]
    spec, want = _spec("Softmax", {"axis": axis}, inputs)
    tactic = registry.get("triton_softmax")
    assert tactic.supports(spec, CPU) is None
    for config in tactic.configs(spec, CPU, 3):
        _check(tactic.compile(spec, config, CPU)(inputs)[0], want[0])


def test_softmax_supports_reasons():
    x = torch.randn(2, 3, 4)
    tactic = registry.get("triton_softmax")
    assert "2-D" in tactic.supports(_spec("Softmax", {"axis": 1, "flatten": 1}, [x])[0], CPU)
    assert "last" in tactic.supports(_spec("Softmax", {"axis": 1}, [x])[0], CPU)
    assert "float" in tactic.supports(_spec("Softmax", {"axis": -1}, [x.double()])[0], CPU)


def test_row_configs():
    assert common.row_configs(768, 1) == [{"BLOCK": 1024, "num_warps": 4}]
    wide = common.row_configs(100_000, 5)
    assert wide[0]["BLOCK"] == common.MAX_ROW_BLOCK and len(wide) > 3
    assert all(1 <= c["BLOCK"] // (32 * c["num_warps"]) <= 64 for c in wide)


def _cuda():
    return Device("cuda", torch.cuda.get_device_name(0), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [768, 1000, 20000])
def test_gpu_layernorm_every_config(dtype, width):
    inputs = [torch.randn(128, width, device="cuda").to(dtype), torch.randn(width, device="cuda").to(dtype),
              torch.randn(width, device="cuda").to(dtype)]
    spec, want = _spec("LayerNormalization", LN, inputs, consts={1, 2})
    tactic = registry.get("triton_layernorm")
    for config in tactic.configs(spec, _cuda(), 5):
        _check(tactic.compile(spec, config, _cuda())(inputs)[0], want[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 12, 128, 128), (4, 30000)])
def test_gpu_softmax_every_config(dtype, shape):
    inputs = [(torch.randn(shape, device="cuda") * 5).to(dtype)]
    spec, want = _spec("Softmax", {"axis": -1}, inputs)
    tactic = registry.get("triton_softmax")
    for config in tactic.configs(spec, _cuda(), 5):
        _check(tactic.compile(spec, config, _cuda())(inputs)[0], want[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("outputs", [1, 2])
def test_add_layernorm_tactic(dtype, outputs):
    """Residual add + LayerNorm in one kernel: Y (and S = A + B, rounded like the unfused Add, when requested);
    A read through strided rows as a view tactic leaves it."""
    a = (torch.randn(3, 5, 64) * 3)[..., :50].to(dtype)
    inputs = [a, torch.randn(3, 5, 50).to(dtype), torch.randn(50).to(dtype), torch.randn(50).to(dtype)]
    spec, want = _spec("AddLayerNorm", LN, inputs, consts={2, 3}, outputs=outputs)
    tactic = registry.get("triton_add_layernorm")
    assert tactic.supports(spec, CPU) is None
    configs = tactic.configs(spec, CPU, 3)
    assert configs and all(c["BLOCK"] >= 50 for c in configs)
    for config in configs[:2]:
        got = tactic.compile(spec, config, CPU)(inputs)
        _check(got[0], want[0])
        if outputs == 2:  # bit-exact but in bf16, where the CPU interpreter's rounding may truncate
            assert torch.equal(got[1], want[1]) if dtype != torch.bfloat16 else _check(got[1], want[1]) is None
        else:  # the sum nobody reads is not computed, and the autotuner's check does not ask for it
            assert got[1] is None
            assert _close(got, used_outputs(spec, want), False) is None
            assert "output 1" in _close(got, want, False)  # what rejected the tactic at every BERT layer


def test_add_layernorm_supports_reasons():
    x, w = torch.randn(2, 4, 6), torch.randn(6)
    tactic = registry.get("triton_add_layernorm")
    assert "shapes differ" in tactic.supports(_spec("AddLayerNorm", LN, [x, torch.randn(1, 4, 6), w])[0], CPU)
    assert "last dim" in tactic.supports(_spec("AddLayerNorm", {**LN, "axis": 1}, [x, x, torch.randn(4, 6)])[0], CPU)


def test_add_layernorm_takes_symbolic_rows_and_runs_at_any_row_count():
    """A dynamic engine's AddLayerNorm ([batch, seq, 64]) compiles once and runs at every batch and sequence."""
    w, b = torch.randn(64), torch.randn(64)
    x = torch.randn(2, 3, 64)
    spec, _ = _spec("AddLayerNorm", LN, [x, x, w, b], consts={2, 3})
    sym = ValueSpec(DType.FLOAT32, ("batch", "seq", 64))
    spec = LayerSpec("l", "AddLayerNorm", LN, (sym, sym, *spec.inputs[2:]), (sym, ValueSpec(None, None)))
    tactic = registry.get("triton_add_layernorm")
    assert tactic.supports(spec, CPU) is None
    configs = tactic.configs(spec, CPU, 3)
    assert {c.get("ROWS", 1) for c in configs} >= {1, 2, 4, 8}  # one row a program, and blocks of rows
    for config in configs:
        kernel = tactic.compile(spec, config, CPU)
        for shape in [(1, 1, 64), (3, 7, 64)]:  # fewer rows than a block, and a ragged last block
            a, r = torch.randn(shape), torch.randn(shape)
            _check(kernel([a, r, w, b])[0], run_reference("AddLayerNorm", [a, r, w, b], LN)[0])
    other = ValueSpec(DType.FLOAT32, ("batch", "other", 64))
    assert "shapes differ" in tactic.supports(LayerSpec("l", "AddLayerNorm", LN, (sym, other, *spec.inputs[2:]),
                                                        spec.outputs), CPU)


def _embedding(dtype, g, ids_shape=(3, 7), width=40):
    """BERT's embedding inputs at a small size: token and segment lookups, folded positions [1, S, H], γ, β."""
    seq = ids_shape[-1]
    return [torch.randint(-60, 60, ids_shape, generator=g), torch.randn(60, width, generator=g).to(dtype),
            torch.randint(0, 2, ids_shape, generator=g), torch.randn(2, width, generator=g).to(dtype), None, None,
            torch.randn(1, seq, width, generator=g).to(dtype), torch.randn(width, generator=g).to(dtype),
            torch.randn(width, generator=g).to(dtype)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_embed_layernorm_tactic(dtype):
    """Token + segment lookups (negative token ids count from the end) + positions, normalized, in one kernel: the
    sums rounded in the half type as the unfused Adds, so fp16 is bit-exact; every config, blocks of rows too."""
    g = torch.Generator().manual_seed(0)
    inputs = _embedding(dtype, g)
    spec, want = _spec("EmbedLayerNorm", LN, inputs, consts={1, 3, 6, 7, 8})
    tactic = registry.get("triton_embed_layernorm")
    assert tactic.supports(spec, CPU) is None
    configs = tactic.configs(spec, CPU, 3)
    assert {c.get("ROWS", 1) for c in configs} == {1, 4}
    for config in configs[:3]:
        got = tactic.compile(spec, config, CPU)(inputs)[0]
        _check(got, want[0])
        if dtype == torch.float16:
            assert torch.equal(got, want[0])


def test_embed_layernorm_kernel_terms_and_broadcasts():
    """One to three lookups, a [1, S] position lookup and [S, H] constant rows repeating over the batch, no bias; an
    index outside the table reads zeros (the reference raises); shapes that do not repeat are refused."""
    g = torch.Generator().manual_seed(1)
    ids, table, tt, seg = torch.randint(0, 60, (2, 5), generator=g), torch.randn(60, 24), torch.randint(0, 2, (2, 5)), \
        torch.randn(2, 24)
    pos, pos_table, rows = torch.arange(5).reshape(1, 5), torch.randn(5, 24), torch.randn(5, 24)
    w = torch.randn(24)
    for terms, const in [([(ids, table)], None), ([(ids, table)], rows), ([(ids, table), (tt, seg), (pos, pos_table)],
                                                                          None)]:
        flat = [x for term in terms for x in term] + [None] * (6 - 2 * len(terms))
        want = run_reference("EmbedLayerNorm", [*flat, const, w, None], LN)[0]
        _check(layernorm.embed_layer_norm(terms, const, w, None, 1e-5, CHUNKED | {"BLOCK": 32}), want)
    far = ids.clone()
    far[0, 0] = 60
    got = layernorm.embed_layer_norm([(far, table), (tt, seg)], None, w, None, 1e-5)
    _check(got[0, 0], run_reference("LayerNormalization", [seg[tt[0, 0]], w], LN)[0])
    with pytest.raises(ValueError, match="does not repeat"):
        layernorm.embed_layer_norm([(ids, table), (torch.zeros(2, 1, dtype=torch.int64), seg)], None, w, None, 1e-5)


def test_embed_layernorm_supports_reasons():
    g = torch.Generator().manual_seed(2)
    inputs = _embedding(torch.float32, g)
    tactic = registry.get("triton_embed_layernorm")
    spec = _spec("EmbedLayerNorm", LN, inputs, consts={1, 3, 6, 7, 8})[0]
    bad = LayerSpec("l", "EmbedLayerNorm", LN, (ValueSpec(DType.FLOAT32, (3, 7)), *spec.inputs[1:]), spec.outputs)
    assert "int32 / int64" in tactic.supports(bad, CPU)
    wide = ValueSpec(DType.FLOAT32, (3, 7, common.MAX_ROW_BLOCK * 2))
    assert "wider" in tactic.supports(LayerSpec("l", "EmbedLayerNorm", LN, spec.inputs, (wide,)), CPU)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch, width", [(1, 384), (64, 768)])
def test_gpu_embed_layernorm_every_config(dtype, batch, width):
    """MiniLM's and BERT-base's embeddings (vocabulary 30,522, sequence 128) on the GPU, every config at level 5."""
    g = torch.Generator().manual_seed(3)
    inputs = [torch.randint(0, 30522, (batch, 128), generator=g), torch.randn(30522, width, generator=g).to(dtype),
              torch.randint(0, 2, (batch, 128), generator=g), torch.randn(2, width, generator=g).to(dtype), None,
              None, torch.randn(1, 128, width, generator=g).to(dtype), torch.rand(width, generator=g).to(dtype) + 0.5,
              torch.randn(width, generator=g).to(dtype)]
    inputs = [None if t is None else t.cuda() for t in inputs]
    spec, want = _spec("EmbedLayerNorm", LN, inputs, consts={1, 3, 6, 7, 8})
    tactic = registry.get("triton_embed_layernorm")
    assert tactic.supports(spec, _cuda()) is None
    for config in tactic.configs(spec, _cuda(), 5):
        _check(tactic.compile(spec, config, _cuda())(inputs)[0], want[0])
