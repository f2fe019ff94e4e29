"""View tactics (tactics/views.py): layout layers return views of their input, equal to the reference exactly;
an engine running them (forced on the CPU) gives the reference engine's outputs bit for bit and dense outputs."""


import numpy as np
import onnxruntime as ort
import pytest
import torch

import kiln
from kiln.tactics.choice import Choice
from kiln.target.device import Device
from kiln.runtime import Engine
from kiln.ir import DType
from kiln.kinds import run_reference
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec, layer_spec

from models.export import export  # noqa: E402
from models.text import LastHidden  # noqa: E402

CPU = Device("cpu", "cpu", "cpu")
VIEWS = [t for t in ("view_reshape", "view_transpose", "view_expand", "view_slice", "view_gather")]


def _i64(*v):
    return torch.tensor(v, dtype=torch.int64)


def _spec(kind, x, consts, attrs):
    ins = [x, *consts]
    want = run_reference(kind, ins, attrs)[0]
    vals = (ValueSpec(DType.from_torch(x.dtype), tuple(x.shape)),) + tuple(
        None if c is None else ValueSpec(DType.INT64, tuple(c.shape), c) for c in consts)
    return LayerSpec("l", kind, attrs, vals, (ValueSpec(DType.from_torch(want.dtype), tuple(want.shape)),)), ins, want


CASES = {
    "reshape": ("Reshape", [_i64(2, 0, 4, 5, 4)], {"allowzero": 0}, "view_reshape"),
    "flatten": ("Flatten", [], {"axis": 2}, "view_reshape"),
    "squeeze": ("Squeeze", [_i64(1)], {}, "view_reshape"),
    "unsqueeze": ("Unsqueeze", [_i64(0, -1)], {}, "view_reshape"),
    "transpose": ("Transpose", [], {"perm": [0, 2, 1, 3]}, "view_transpose"),
    "transpose_default": ("Transpose", [], {}, "view_transpose"),
    "slice": ("Slice", [_i64(1, -7), _i64(100, -1), _i64(-1, 2), _i64(1, 2)], {}, "view_slice"),
    "gather": ("Gather", [torch.tensor(-1)], {"axis": 2}, "view_gather"),
    "expand": ("Expand", [_i64(3, 2, 1, 4, 20)], {}, "view_expand"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_view_equals_reference_and_aliases(case):
    kind, consts, attrs, name = CASES[case]
    x = torch.randn(2, 1 if kind == "Squeeze" else 3, 4, 20)
    if kind == "Squeeze":
        x = torch.randn(2, 1, 4, 20)
    spec, ins, want = _spec(kind, x, consts, attrs)
    tactic = registry.get(name)
    assert tactic.untimed and tactic.supports(spec, CPU) is None
    got = tactic.compile(spec, {}, CPU)(ins)[0]
    assert got.shape == want.shape and torch.equal(got, want)
    assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # a view: no copy


def test_refusals():
    x = torch.randn(2, 3, 4)
    spec, _, _ = _spec("Slice", x, [_i64(3), _i64(0), _i64(1), _i64(-1)], {})
    assert "negative step" in registry.get("view_slice").supports(spec, CPU)
    spec, _, _ = _spec("Gather", x, [_i64(0, 1)], {"axis": 0})
    assert "one constant integer" in registry.get("view_gather").supports(spec, CPU)
    spec, _, _ = _spec("Reshape", x, [_i64(6, 4)], {})
    dyn = LayerSpec("l", "Reshape", {}, (ValueSpec(DType.FLOAT32, ("b", 3, 4)), spec.inputs[1]), spec.outputs)
    assert "not static" in registry.get("view_reshape").supports(dyn, CPU)
    unknown = LayerSpec("l", "Transpose", {}, (ValueSpec(DType.FLOAT32, None),), (ValueSpec(DType.FLOAT32, None),))
    assert "rank unknown" in registry.get("view_transpose").supports(unknown, CPU)


def test_transpose_is_a_view_at_symbolic_shapes():
    """A dynamic engine's head split / merge: one compiled permutation, a view at every batch and sequence."""
    sym = ValueSpec(DType.FLOAT32, ("b", "s", 2, 4))
    spec = LayerSpec("l", "Transpose", {"perm": [0, 2, 1, 3]}, (sym,), (ValueSpec(DType.FLOAT32, ("b", 2, "s", 4)),))
    tactic = registry.get("view_transpose")
    assert tactic.supports(spec, CPU) is None
    kernel = tactic.compile(spec, {}, CPU)
    for shape in [(1, 1, 2, 4), (3, 5, 2, 4)]:
        x = torch.randn(shape)
        got = kernel([x])[0]
        assert torch.equal(got, x.permute(0, 2, 1, 3)) and got.data_ptr() == x.data_ptr()


def test_autotuner_takes_views_untimed():
    from kiln.builder.autotune import Autotuner

    spec, _, _ = _spec("Transpose", torch.randn(2, 3, 4), [], {"perm": [1, 0, 2]})
    gpu_like = Device("cuda", "test", "cuda")  # candidates() reads only the backend; no device is touched
    choice = Autotuner.choose(_Tuner(gpu_like), spec)
    assert choice.tactic == "view_transpose" and choice.source == "heuristic"


def _Tuner(device):
    """An Autotuner with only what choose reads before it would measure (no device is touched)."""
    from kiln.builder.autotune import Autotuner

    tuner = Autotuner.__new__(Autotuner)
    tuner.device, tuner.level, tuner.cache = device, 3, None
    return tuner


def _bert_onnx(tmp_path, seq=16):
    """The benchmark's BERT form (transformers' default attention) at a small width, static batch 2."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = LastHidden(BertModel(BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=128, max_position_embeddings=64)).eval())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 300, (2, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, seq // 2:] = 0
    args = (ids, mask, torch.zeros_like(ids))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    path = export(model, args, tmp_path / "bert.onnx", dynamo=False, input_names=names,
                  output_names=["last_hidden_state", "pooler_output"])
    return path, {n: a.numpy() for n, a in zip(names, args)}


def forced_views(engine):
    """The engine rebuilt with every layer a view tactic supports running it (what a GPU build chooses)."""
    choices = {}
    for layer in engine.network.layers:
        spec = layer_spec(engine.network, layer, engine.weights)
        for name in VIEWS:
            t = registry.get(name)
            if layer.kind in t.kinds and t.supports(spec, CPU) is None:
                choices[layer.name] = Choice(name)
                break
    return Engine(engine.network, engine.config, engine.device, tactics=choices), len(choices)


def test_bert_engine_with_views_matches_reference_and_onnxruntime(tmp_path):
    path, feeds = _bert_onnx(tmp_path)
    ref = kiln.build(str(path), kiln.BuildConfig(device="cpu"))
    viewed, n = forced_views(ref)
    kinds = {l.kind for l in ref.network.layers if viewed.tactics[l.name].tactic.startswith("view_")}
    assert n >= 16 and {"Reshape", "Transpose"} <= kinds, (n, kinds)
    want, got = ref.run(feeds), viewed.run(feeds)
    ctx = viewed.create_context()
    raw = ctx.run({k: torch.from_numpy(v) for k, v in feeds.items()})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        assert raw[k].is_contiguous()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for name, value in zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)):
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tactic", ["cublaslt_fused_gemm", "triton_fused_gemm"])
def test_fused_gemm_on_transposed_view_runs_rows_in_memory_order(tactic):
    """ViT's (S, B, E) Transpose view into the QKV projection: no copy of the input, the output comes back as
    the same permutation of a dense result, values as the reference on a contiguous copy."""
    import os

    if tactic.startswith("triton") and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    x = torch.randn(2, 5, 16).transpose(0, 1)  # (5, 2, 16), rows of the (2, 5, 16) memory
    w, b = torch.randn(16, 24), torch.randn(24)
    want = run_reference("FusedGemm", [x.contiguous(), w, b], {"trans_b": False, "activation": "Gelu",
                                                                "activation_params": []})[0]
    f32 = DType.FLOAT32
    spec = LayerSpec("l", "FusedGemm", {"trans_b": False, "activation": "Gelu", "activation_params": []},
                     (ValueSpec(f32, (5, 2, 16)), ValueSpec(f32, (16, 24), w), ValueSpec(f32, (24,), b)),
                     (ValueSpec(f32, (5, 2, 24)),))
    config = {} if tactic.startswith("cublas") else {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1,
                                                      "num_warps": 4, "num_stages": 1}
    got = registry.get(tactic).compile(spec, config, CPU)([x, w, b])[0]
    assert got.shape == (5, 2, 24) and got.transpose(0, 1).is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
