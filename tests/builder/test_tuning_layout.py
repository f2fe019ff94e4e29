"""The autotuner times each candidate on inputs laid out as the engine will hand them over: 4-D FusedAttention on
head-split views of Q, Kᵀ and V (D contiguous, heads inside a row), NHWC convs on channels_last; values unchanged."""

import torch

from kiln.builder.autotune import _in_layout
from kiln.ir import DType
from kiln.tactics.spec import LayerSpec, ValueSpec


def _spec(kind, shapes):
    vals = tuple(ValueSpec(DType.FLOAT16, s) for s in shapes)
    return LayerSpec("l", kind, {}, vals, (ValueSpec(DType.FLOAT16, shapes[0]),))


def test_attention_inputs_are_head_split_views():
    b, h, s, d = 2, 3, 5, 4
    q, kt, v = torch.randn(b, h, s, d), torch.randn(b, h, d, s), torch.randn(b, h, s, d)
    mask = torch.randn(b, 1, 1, s)
    got = _in_layout([q, kt, v, mask], _spec("FusedAttention", [q.shape, kt.shape, v.shape, mask.shape]), {})
    for x, want in zip(got, (q, kt, v, mask)):
        assert torch.equal(x, want)
    assert got[0].stride() == (s * h * d, d, h * d, 1) and got[2].stride() == got[0].stride()
    assert got[1].stride() == (s * h * d, d, 1, h * d) and got[3] is mask


def test_three_d_attention_and_nchw_layers_keep_their_inputs():
    q = torch.randn(3, 5, 4)
    kt, v = torch.randn(3, 4, 5), torch.randn(3, 5, 4)
    got = _in_layout([q, kt, v], _spec("FusedAttention", [q.shape, kt.shape, v.shape]), {})
    assert all(a is b for a, b in zip(got, (q, kt, v)))
    x = torch.randn(1, 8, 4, 4)
    (same,) = _in_layout([x], _spec("Conv", [x.shape]), {"layout": "nchw"})
    (nhwc,) = _in_layout([x], _spec("Conv", [x.shape]), {"layout": "nhwc"})
    assert same is x and torch.equal(nhwc, x) and nhwc.is_contiguous(memory_format=torch.channels_last)


def test_a_quantized_attention_output_is_checked_within_its_float_tolerance_in_int8_steps():
    """An int8 attention output quantizes a float result that may differ by the float dtype's tolerance (fp16: 1 %,
    1.3 steps at amax / 127): 2 steps more than the 1 a requantizing layer gets; 4 steps off still fails."""
    from kiln.builder.autotune import _close, _float_lsb

    def spec(kind, dtype, q_scale):
        v = ValueSpec(dtype, (1, 2, 4, 16))
        return LayerSpec("l", kind, {"q_scale": q_scale}, (v, v, v), (ValueSpec(DType.INT8, (1, 2, 4, 16)),))

    assert _float_lsb(spec("FusedAttention", DType.FLOAT16, 0.01)) == 2
    assert _float_lsb(spec("FusedAttention", DType.FLOAT16, None)) == 0
    assert _float_lsb(spec("AddLayerNorm", DType.FLOAT16, 0.01)) == 0  # its float result is computed exactly so
    want = torch.zeros(8, dtype=torch.int8)
    for off, ok in ((3, True), (4, False)):
        got = want.clone()
        got[0] = off
        assert (_close([got], [want], False, requantized=True, extra_lsb=2) is None) is ok
    assert _close([want + 2], [want], False, requantized=True) is not None  # one step only without the extra


def test_random_indices_fit_every_table():
    """The autotuner's integer inputs are -1 and 0, valid rows of any non-empty axis (a two-row segment table, a
    one-row one): larger random values made the reference's lookups fail, on a GPU with a device-side assert."""
    from kiln.builder.autotune import _random_input
    from kiln.kinds import run_reference

    for dtype in (DType.INT64, DType.INT32):
        ids = _random_input(ValueSpec(dtype, (64, 128)), "cpu")
        assert ids.dtype == dtype.torch and set(ids.unique().tolist()) == {-1, 0}
        for rows in (1, 2):
            table = torch.randn(rows, 8)
            assert run_reference("Gather", [table, ids], {"axis": 0})[0].shape == (64, 128, 8)
