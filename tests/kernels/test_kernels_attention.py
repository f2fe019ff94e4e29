"""Triton flash attention and the triton_flash_attention tactic against the Attention reference.

Shapes are tiny and odd (Sq 19, Skv 23, head dims 20 / 24) so every tile edge is masked.
Tolerances: fp32 1e-5 (fp32 softmax and dots like the reference); fp16 / bf16 the autotuner's (the
reference rounds scores, probabilities and products to the half type, the kernel keeps fp32).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kiln.builder.autotune import TOLERANCE  # noqa: E402
from kiln.target.device import Device  # noqa: E402
from kiln.ir import DType  # noqa: E402
from kiln.kernels import attention  # noqa: E402
from kiln.kinds import run_reference  # noqa: E402
from kiln.tactics import registry  # noqa: E402
from kiln.tactics.spec import LayerSpec, ValueSpec  # noqa: E402

TOL = {**TOLERANCE, torch.float32: (1e-5, 1e-5)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CPU = Device("cpu", "cpu", "cpu")
SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
ATTRS = {"scale": None, "is_causal": 0, "softcap": 0.0, "softmax_precision": None, "qk_matmul_output_mode": 0,
         "left_window_size": -1, "right_window_size": -1, "q_num_heads": 0, "kv_num_heads": 0}
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter: -inf - -inf


def _spec(attrs, inputs, reference=True):
    """The Attention LayerSpec of these inputs with only Y requested, and the reference outputs (if asked)."""
    vals = tuple(None if t is None else ValueSpec(DType.from_torch(t.dtype), tuple(t.shape)) for t in inputs)
    want = run_reference("Attention", inputs, attrs) if reference else None
    y = ValueSpec(vals[0].dtype, tuple(want[0].shape) if want else None)
    return LayerSpec("l", "Attention", attrs, vals, (y,) + (ValueSpec(None, None),) * 3), want


def _check(got, want):
    rtol, atol = TOL[want.dtype]
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def _qkv(dtype, b=2, hq=4, hkv=2, sq=19, skv=23, d=20, dv=24):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype) for s in ((b, hq, sq, d), (b, hkv, skv, d), (b, hkv, skv, dv))]


def _mask(kind, dtype):
    """None, an additive (Sq, Skv) mask with one fully -inf row, or a boolean (B, 1, Sq, Skv) one with an empty row."""
    if kind == "add":
        m = torch.randn(19, 23).to(dtype)
        m[3] = float("-inf")
        return m
    if kind == "bool":
        m = torch.rand(2, 1, 19, 23, generator=torch.Generator().manual_seed(1)) > 0.3
        m[0, 0, 5] = False
        return m
    return None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask", [None, "add", "bool"])
def test_kernel(dtype, causal, mask):
    """GQA (4 query heads on 2 KV heads), Sq ≠ Skv, masks broadcast over batch and heads, empty rows give 0."""
    inputs = _qkv(dtype) + [_mask(mask, dtype)]
    want = run_reference("Attention", inputs, {**ATTRS, "is_causal": causal})[0]
    _check(attention.attention(*inputs, causal=bool(causal), config=SMALL), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("skv", [23, 32])
@pytest.mark.parametrize("kind", ["add", "bool"])
def test_key_padding_mask(dtype, skv, kind):
    """A (B, 1, 1, Skv) mask is read as one vector per key tile; Skv 32 takes the unmasked key loads (two whole
    tiles of 16). Batch 1 attends to no key at all: zeros, where the reference gives NaN."""
    keep = torch.rand(2, 1, 1, skv, generator=torch.Generator().manual_seed(2)) > 0.4
    keep[1] = False
    mask = keep if kind == "bool" else torch.where(keep, 0.0, float("-inf")).to(dtype)
    inputs = _qkv(dtype, skv=skv) + [mask]
    want = run_reference("Attention", inputs, ATTRS)[0].nan_to_num(0.0)
    _check(attention.attention(*inputs, config=SMALL), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_with_a_row_mask_on_whole_key_tiles(dtype):
    """Skv 32 (two whole tiles of 16: no key bounds), causal and a mask that varies along the query rows."""
    inputs = _qkv(dtype, sq=32, skv=32)
    mask = torch.randn(32, 32, generator=torch.Generator().manual_seed(3)).to(dtype)
    want = run_reference("Attention", inputs + [mask], {**ATTRS, "is_causal": 1})[0]
    _check(attention.attention(*inputs, mask, causal=True, config=SMALL), want)


@pytest.mark.parametrize("d,dv", [(16, 16), (128, 64), (96, 128)])
def test_head_dims(d, dv):
    inputs = _qkv(torch.float16, b=1, hq=2, hkv=1, sq=9, skv=9, d=d, dv=dv)
    want = run_reference("Attention", inputs, ATTRS)[0]
    _check(attention.attention(*inputs, config=SMALL), want)


def test_tactic_causal_with_mask_and_scale():
    """What SDPA's tactic refuses (is_causal with a mask) the Triton one runs; an explicit scale is honoured."""
    inputs = _qkv(torch.float32) + [_mask("add", torch.float32)]
    spec, want = _spec({**ATTRS, "is_causal": 1, "scale": 0.3}, inputs)
    tactic = registry.get("triton_flash_attention")
    assert tactic.supports(spec, CPU) is None
    assert registry.get("sdpa").supports(spec, CPU) is not None
    _check(tactic.compile(spec, SMALL, CPU)(inputs)[0], want[0])


def test_tactic_default_config():
    inputs = _qkv(torch.float16, b=1, hq=2, hkv=2, sq=40, skv=40, d=32, dv=32)
    spec, want = _spec(ATTRS, inputs)
    tactic = registry.get("triton_flash_attention")
    (config,) = tactic.configs(spec, CPU, 0)
    _check(tactic.compile(spec, config, CPU)(inputs)[0], want[0])


def test_supports_reasons():
    tactic = registry.get("triton_flash_attention")
    q, k, v = _qkv(torch.float32, d=8, dv=8)
    assert "16..128" in tactic.supports(_spec(ATTRS, [q, k, v])[0], CPU)
    q, k, v = _qkv(torch.float32, hq=3, hkv=2)
    assert "multiple" in tactic.supports(_spec(ATTRS, [q, k, v], reference=False)[0], CPU)
    q, k, v = _qkv(torch.float32)
    assert "softcap" in tactic.supports(_spec({**ATTRS, "softcap": 5.0}, [q, k, v])[0], CPU)
    assert "broadcast" in tactic.supports(_spec(ATTRS, [q, k, v, torch.zeros(3, 1, 19, 23)], reference=False)[0], CPU)
    q3, k3, v3 = (t.transpose(1, 2).reshape(2, t.shape[2], -1) for t in _qkv(torch.float32, hkv=4))
    assert "4-D" in tactic.supports(_spec({**ATTRS, "q_num_heads": 4, "kv_num_heads": 4}, [q3, k3, v3])[0], CPU)


def _fused_spec(attrs, inputs):
    vals = tuple(ValueSpec(DType.from_torch(t.dtype), tuple(t.shape)) for t in inputs)
    want = run_reference("FusedAttention", inputs, attrs)
    out = ValueSpec(DType.from_torch(want[0].dtype), tuple(want[0].shape))
    return LayerSpec("l", "FusedAttention", attrs, vals, (out,)), want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale_on,scale", [("scores", 0.125), ("qk", None)])
@pytest.mark.parametrize("mask_shape", [None, (2, 1, 1, 23), (19, 23)])
def test_fused_attention_4d(dtype, scale_on, scale, mask_shape):
    """FusedAttention with KT pre-transposed, BERT's (B, 1, 1, S) padding mask or a per-position one."""
    q, k, v = _qkv(dtype, hkv=4)
    mask = [] if mask_shape is None else [torch.randn(mask_shape).to(dtype)]
    inputs = [q, k.transpose(-1, -2).contiguous(), v] + mask
    spec, want = _fused_spec({"scale": scale, "scale_on": scale_on}, inputs)
    tactic = registry.get("triton_fused_attention")
    assert tactic.supports(spec, CPU) is None
    _check(tactic.compile(spec, SMALL, CPU)(inputs)[0], want[0])


@pytest.mark.parametrize("name", ["triton_fused_attention", "sdpa_fused_attention"])
@pytest.mark.parametrize("keep_dtype", [torch.int64, torch.int32, torch.bool])
def test_fused_attention_keep_mask(name, keep_dtype):
    """A keep mask (passes/attention_keep_mask.py: Hugging Face's padding mask as given, zero = masked out) gives
    what the additive mask of 0 and its mask_fill (-inf, or -3) gives, through both tactics and the reference."""
    q, k, v = _qkv(torch.float16, hkv=4)
    keep = torch.rand(2, 1, 1, 23, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[:, ..., 0] = True  # every row keeps a key
    inputs = [q, k.transpose(-1, -2).contiguous(), v]
    attrs = {"scale": None, "scale_on": "scores"}
    spec, want = _fused_spec(attrs, inputs + [keep.to(keep_dtype) * (3 if keep_dtype != torch.bool else 1)])
    _, additive = _fused_spec(attrs, inputs + [torch.where(keep, 0.0, float("-inf")).half()])
    torch.testing.assert_close(want[0], additive[0], rtol=0, atol=0)
    low = {"scale": None, "scale_on": "scores", "mask_fill": -3.0}  # a mild fill: the keys masked still count
    spec_low, want_low = _fused_spec(low, inputs + [keep.to(keep_dtype)])
    _, additive_low = _fused_spec(attrs, inputs + [torch.where(keep, 0.0, -3.0).half()])
    torch.testing.assert_close(want_low[0], additive_low[0], rtol=0, atol=0)
    tactic = registry.get(name)
    assert tactic.supports(spec, CPU) is None
    config = SMALL if name.startswith("triton") else tactic.configs(spec, CPU, 0)[0]
    _check(tactic.compile(spec, config, CPU)(inputs + [keep.to(keep_dtype) * (3 if keep_dtype != torch.bool
                                                                                 else 1)])[0], want[0])
    _check(tactic.compile(spec_low, config, CPU)(inputs + [keep.to(keep_dtype)])[0], want_low[0])


def test_fused_attention_3d_with_3d_mask():
    q, k, v = (t.reshape(-1, *t.shape[2:]) for t in _qkv(torch.float32, hkv=4))
    inputs = [q, k.transpose(-1, -2), v, torch.randn(8, 19, 23)]
    spec, want = _fused_spec({"scale": None, "scale_on": "scores"}, inputs)
    tactic = registry.get("triton_fused_attention")
    assert tactic.supports(spec, CPU) is None
    _check(tactic.compile(spec, SMALL, CPU)(inputs)[0], want[0])


@pytest.mark.parametrize("name", ["triton_fused_attention", "sdpa_fused_attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_attention_int8_output_is_its_float_output_quantized(name, dtype):
    """With q_scale (quant/fold_quantize.py) a tactic writes int8: exactly QuantizeLinear of the float output it
    writes without q_scale (rounded to Q's dtype), as the unfused graph computes it; near the reference's."""
    q, k, v = _qkv(dtype, hkv=4)
    mask = torch.randn(2, 1, 1, 23, generator=torch.Generator().manual_seed(1)).to(dtype)
    inputs = [q, k.transpose(-1, -2).contiguous(), v, mask]
    plain_spec, plain = _fused_spec({"scale": None, "scale_on": "scores"}, inputs)
    q_scale = float(plain[0].float().abs().max()) / 200  # the largest values saturate at ±127
    spec, want = _fused_spec({"scale": None, "scale_on": "scores", "q_scale": q_scale, "q_dtype": DType.INT8}, inputs)
    tactic = registry.get(name)
    assert want[0].dtype == torch.int8 and tactic.supports(spec, CPU) is None
    config = SMALL if name.startswith("triton") else tactic.configs(spec, CPU, 0)[0]
    got = tactic.compile(spec, config, CPU)(inputs)[0]
    y = tactic.compile(plain_spec, config, CPU)(inputs)[0]
    quantized = run_reference("QuantizeLinear", [y, torch.tensor(q_scale)],
                              {"axis": 1, "block_size": 0, "saturate": True, "output_dtype": DType.INT8,
                               "precision": None})[0]
    assert got.dtype == torch.int8 and torch.equal(got, quantized)
    assert (got.int() - want[0].int()).abs().max() <= 1 and got.int().abs().max() >= 127  # saturated: 127 or -128


def test_fused_attention_supports_reasons():
    tactic = registry.get("triton_fused_attention")
    q, k, v = _qkv(torch.float32, hkv=4)
    assert "3-D or all 4-D" in tactic.supports(_fused_spec({"scale": None, "scale_on": "scores"},
                                                           [q[0, 0], k[0, 0].t(), v[0, 0]])[0], CPU)
    fp8 = {"scale": None, "scale_on": "scores", "q_scale": 0.1, "q_dtype": DType.FP8E4M3}
    spec, _ = _fused_spec(fp8, [q, k.transpose(-1, -2), v])
    assert "int8 only" in tactic.supports(spec, CPU) and "int8 only" in registry.get("sdpa_fused_attention").supports(
        spec, CPU)
    half_mask = torch.zeros(19, 23).half()
    spec, _ = _fused_spec({"scale": None, "scale_on": "scores"}, [q, k.transpose(-1, -2), v, half_mask])
    assert "float" in tactic.supports(spec, CPU)


@pytest.mark.parametrize("level,count", [(0, 1), (1, 1), (3, 2)])
def test_configs_fit_shared_memory(level, count):
    for itemsize in (2, 4):
        many = attention.configs(128, 64, 64, itemsize, 48 * 1024, level)
        assert len(many) >= count and all(attention.smem_bytes(c, 64, 64, itemsize) <= 48 * 1024 for c in many)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,mask", [(0, None), (0, "bert"), (1, None)])
def test_gpu_bert_base_every_config(dtype, causal, mask):
    """B=1 H=12 S=128 D=64 (BERT-base), with BERT's additive (B, 1, 1, S) padding mask."""
    q, k, v = (torch.randn(1, 12, 128, 64, device="cuda").to(dtype) for _ in range(3))
    m = None
    if mask:
        m = torch.zeros(1, 1, 1, 128, device="cuda", dtype=dtype)
        m[..., 100:] = -10000.0
    spec, want = _spec({**ATTRS, "is_causal": causal}, [q, k, v, m])
    tactic, device = registry.get("triton_flash_attention"), Device("cuda", torch.cuda.get_device_name(0), "cuda")
    assert tactic.supports(spec, device) is None
    for config in tactic.configs(spec, device, 5):
        _check(tactic.compile(spec, config, device)([q, k, v, m])[0], want[0])


@pytest.mark.gpu
@pytest.mark.parametrize("d", [80, 128])
def test_gpu_long_sequence_gqa(d):
    q = torch.randn(2, 8, 1000, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 2, 1000, d, device="cuda", dtype=torch.float16) for _ in range(2))
    want = run_reference("Attention", [q, k, v], {**ATTRS, "is_causal": 1})[0]
    _check(attention.attention(q, k, v, causal=True), want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keep", [False, True])
def test_gpu_fused_attention_bert_base(dtype, keep):
    """BERT-base's attention with its padding mask additive (finfo.min) or as given (int64, zero masks the key)."""
    q, k, v = (torch.randn(1, 12, 128, 64, device="cuda").to(dtype) for _ in range(3))
    m = torch.zeros(1, 1, 1, 128, device="cuda", dtype=dtype)
    m[..., 90:] = torch.finfo(dtype).min
    if keep:
        m = (m == 0).long()
    inputs = [q, k.transpose(-1, -2), v, m]
    spec, want = _fused_spec({"scale": 0.125, "scale_on": "scores"}, inputs)
    tactic, device = registry.get("triton_fused_attention"), Device("cuda", torch.cuda.get_device_name(0), "cuda")
    assert tactic.supports(spec, device) is None
    for config in tactic.configs(spec, device, 5):
        _check(tactic.compile(spec, config, device)(inputs)[0], want[0])


def test_fused_attention_strided_inputs_heads_inner_output():
    """BERT's layout after view tactics: Q, K, V read through (B, S, H, D) strides of one merged projection;
    the 4-D output is laid out (B, S, H, D), so merging heads back is a view."""
    b, s, h, d = 2, 19, 4, 20
    qkv = torch.randn(b, s, 3 * h * d, generator=torch.Generator().manual_seed(2))
    q, k, v = (t.reshape(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
    inputs = [q, k.transpose(-1, -2), v]
    spec, want = _fused_spec({"scale": None, "scale_on": "qk"}, inputs)
    got = registry.get("triton_fused_attention").compile(spec, SMALL, CPU)(inputs)[0]
    _check(got, want[0])
    assert got.transpose(1, 2).is_contiguous()
    merged = got.transpose(1, 2).reshape(b, s, h * d)
    assert merged.untyped_storage().data_ptr() == got.untyped_storage().data_ptr()
