"""QuantConv / QuantGemm references execute kiln's int8 scheme bit-exactly (kinds/quantized.py)."""

import numpy as np
import torch

from kiln.kinds import run_reference
from kiln.quant.scheme import quantize_weight, scale_from_amax


def _np_epilogue(acc, x_scale, w_scale, bias, axis):
    """The scheme written out in numpy: fp32(acc) · fp32(x_scale·w_scale[c]) + bias, in fp32."""
    shape = [1] * acc.ndim
    shape[axis] = -1
    s = (np.float32(x_scale) * w_scale.astype(np.float32)).astype(np.float32)
    return acc.astype(np.float32) * s.reshape(shape) + bias.astype(np.float32).reshape(shape)


def test_quant_gemm_integer_accumulate_and_requantize():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (5, 64), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (6, 64), generator=g, dtype=torch.int8)
    ws, b = torch.rand(6, generator=g) * 0.01 + 1e-3, torch.randn(6, generator=g)
    attrs = {"x_scale": 0.02, "out_scale": None, "activation": "Relu", "activation_params": []}
    y = run_reference("QuantGemm", [x, w, ws, b], attrs)[0]
    acc = x.numpy().astype(np.int64) @ w.numpy().astype(np.int64).T
    want = np.maximum(_np_epilogue(acc, 0.02, ws.numpy(), b.numpy(), 1), 0)
    assert y.dtype == torch.float32 and np.array_equal(y.numpy(), want)
    q = run_reference("QuantGemm", [x, w, ws, b], attrs | {"out_scale": 0.05})[0]
    assert q.dtype == torch.int8
    # round half to even of an fp32 division, saturated to [-127, 127]
    want_q = np.clip(np.rint(want / np.float32(0.05)), -127, 127).astype(np.int8)
    assert np.array_equal(q.numpy(), want_q)


def test_requantize_rounds_half_to_even_and_saturates():
    x = torch.ones(1, 1, dtype=torch.int8)
    w = torch.ones(4, 1, dtype=torch.int8)
    ws = torch.tensor([0.5, 1.5, 2.5, 1000.0])  # y = ws exactly: 0.5 → 0, 1.5 → 2, 2.5 → 2, 1000 → 127
    y = run_reference("QuantGemm", [x, w, ws, None], {"x_scale": 1.0, "out_scale": 1.0, "activation": "none",
                                                      "activation_params": []})[0]
    assert y.tolist() == [[0, 2, 2, 127]]


def test_quant_conv_matches_integer_convolution_with_residual():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-127, 128, (2, 4, 6, 6), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (8, 2, 3, 3), generator=g, dtype=torch.int8)
    ws, b, r = torch.rand(8, generator=g) * 1e-3, torch.randn(8, generator=g), torch.randn(2, 8, 3, 3, generator=g)
    attrs = {"group": 2, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
             "strides": [2, 2], "x_scale": 0.1, "out_scale": None, "activation": "none", "activation_params": []}
    y = run_reference("QuantConv", [x, w, ws, b, r], attrs)[0]
    acc = torch.nn.functional.conv2d(x.long().double(), w.double(), stride=2, padding=1, groups=2).long().numpy()
    want = _np_epilogue(acc, 0.1, ws.numpy(), b.numpy(), 1) + r.numpy()
    assert np.array_equal(y.numpy(), want)


def test_quant_conv_int8_residual_is_dequantized_by_res_scale():
    """With res_scale the residual is int8 and adds fp32(r_q) · fp32(res_scale), one fp32 product, before the
    activation; requantized as before."""
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-127, 128, (2, 4, 5, 5), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (6, 4, 1, 1), generator=g, dtype=torch.int8)
    ws, b = torch.rand(6, generator=g) * 1e-3, torch.randn(6, generator=g)
    r = torch.randint(-127, 128, (2, 6, 5, 5), generator=g, dtype=torch.int8)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [1, 1], "pads": [0] * 4,
             "strides": [1, 1], "x_scale": 0.1, "out_scale": None, "res_scale": 0.037, "activation": "Relu",
             "activation_params": []}
    y = run_reference("QuantConv", [x, w, ws, b, r], attrs)[0]
    acc = np.einsum("nchw,mc->nmhw", x.numpy().astype(np.int64), w.numpy()[:, :, 0, 0].astype(np.int64))
    res = (r.numpy().astype(np.float32) * np.float32(0.037)).astype(np.float32)   # rounded once, as fp32
    want = np.maximum(_np_epilogue(acc, 0.1, ws.numpy(), b.numpy(), 1) + res, np.float32(0))
    assert y.dtype == torch.float32 and np.array_equal(y.numpy(), want)
    q = run_reference("QuantConv", [x, w, ws, b, r], attrs | {"out_scale": 0.05})[0]
    assert q.dtype == torch.int8 and np.array_equal(q.numpy(), np.clip(np.rint(want / np.float32(0.05)), -127, 127))
    # res_scale absent: the residual is float and read as it is; the same values give the same output
    assert torch.equal(run_reference("QuantConv", [x, w, ws, b, torch.from_numpy(res)], attrs | {"res_scale": None})[0],
                       y)


def test_weight_quantization_is_symmetric_per_output_channel():
    w = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.5, -0.75]])
    q, s = quantize_weight(w, axis=0)
    assert torch.allclose(s[[0, 2]], torch.tensor([2 / 127, 3 / 127]))
    assert q[0].tolist() == [64, -127, 32] and q[1].tolist() == [0, 0, 0] and q[2].tolist() == [127, 64, -32]
    q1, s1 = quantize_weight(w.t(), axis=1)  # the same weights stored [K, N]
    assert torch.equal(q1.t(), q) and torch.equal(s1, s)
    assert scale_from_amax(12.7) == np.float32(0.1)
