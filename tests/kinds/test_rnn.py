"""LSTM, GRU and RNN against ONNX Runtime, randomized: directions, layouts, sequence lengths,
initial states, peepholes, clip, coupled gates and custom activations."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kiln
from kiln.errors import UnsupportedOpError
from opcheck import DEVICE, check_op, make_model

rng = np.random.default_rng(0)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
N_OUT = {"LSTM": 3, "GRU": 2, "RNN": 2}


def f32(*shape):
    return (rng.standard_normal(shape) * 0.5).astype(np.float32)


def rnn_inputs(op, direction="forward", seq=4, batch=3, size=5, hidden=6, lens=None, init=False, peepholes=False):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inputs = {"X": f32(seq, batch, size), "W": f32(dirs, g * hidden, size), "R": f32(dirs, g * hidden, hidden),
              "B": f32(dirs, 2 * g * hidden)}
    order = ["X", "W", "R", "B", "", "", "", ""][: 8 if op == "LSTM" else 6]
    if lens is not None:
        inputs["seq_lens"] = np.array(lens, np.int32)
        order[4] = "seq_lens"
    state = (dirs, batch, hidden)
    if init:
        inputs["h0"] = f32(*state)
        order[5] = "h0"
        if op == "LSTM":
            inputs["c0"] = f32(*state)
            order[6] = "c0"
    if peepholes:
        inputs["P"] = f32(dirs, 3 * hidden)
        order[7] = "P"
    while order[-1] == "":
        order.pop()
    return inputs, order


def check_rnn(op, attrs=None, **kw):
    inputs, order = rnn_inputs(op, direction=(attrs or {}).get("direction", "forward"), **kw)
    hidden = inputs["R"].shape[-1]
    check_op(op, inputs, {"hidden_size": hidden, **(attrs or {})}, opset=14, n_outputs=N_OUT[op],
             input_order=order)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions(op, direction):
    check_rnn(op, {"direction": direction}, init=True)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_batchwise_layout(op):
    """ORT has no layout=1 kernel: compare kiln's layout=1 with ORT's layout=0 on transposed data."""
    inputs, order = rnn_inputs(op, "bidirectional", init=True)
    attrs = {"hidden_size": 6, "direction": "bidirectional"}
    seqwise = make_model(op, inputs, attrs, opset=14, n_outputs=N_OUT[op], input_order=order)
    want = ort.InferenceSession(seqwise.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    swapped = {k: v.transpose(1, 0, 2) if k in ("X", "h0", "c0") else v for k, v in inputs.items()}
    batchwise = make_model(op, swapped, {**attrs, "layout": 1}, opset=14, n_outputs=N_OUT[op], input_order=order)
    got = kiln.build(batchwise, kiln.BuildConfig(device=DEVICE)).create_context().run(swapped)
    np.testing.assert_allclose(got["out0"], want[0].transpose(2, 0, 1, 3), rtol=1e-4, atol=1e-5)
    for i in range(1, N_OUT[op]):
        np.testing.assert_allclose(got[f"out{i}"], want[i].transpose(1, 0, 2), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens(op, direction):
    check_rnn(op, {"direction": direction}, lens=[4, 2, 1], init=True)


def test_lstm_peepholes_clip_and_input_forget():
    check_rnn("LSTM", {"clip": 0.4, "input_forget": 1, "direction": "bidirectional"}, init=True, peepholes=True)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr):
    check_rnn("GRU", {"linear_before_reset": lbr, "clip": 0.8}, init=True)


@pytest.mark.parametrize("op,attrs", [
    ("LSTM", {"activations": ["HardSigmoid", "LeakyRelu", "Softsign"], "activation_alpha": [0.3, 0.05],
              "activation_beta": [0.4]}),
    ("GRU", {"activations": ["Sigmoid", "ScaledTanh", "HardSigmoid", "Elu"], "activation_alpha": [0.7, 0.25, 0.9],
             "activation_beta": [1.3, 0.45], "direction": "bidirectional"}),
    ("RNN", {"activations": ["Relu"]}),
    ("RNN", {"activations": ["Softplus"]}),
    ("RNN", {"activations": ["Affine"], "activation_alpha": [0.6], "activation_beta": [0.2]}),
])
def test_activations(op, attrs):
    check_rnn(op, attrs, init=True)


def test_unknown_activation_is_a_clear_error():
    inputs, order = rnn_inputs("RNN")
    h = onnx.helper
    node = h.make_node("RNN", order, ["", "Y_h"], name="n", hidden_size=6, activations=["Gelu"])
    ins = [h.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in inputs.items()]
    out = h.make_tensor_value_info("Y_h", onnx.TensorProto.FLOAT, (1, 3, 6))
    model = h.make_model(h.make_graph([node], "g", ins, [out]), opset_imports=[h.make_opsetid("", 14)])
    with pytest.raises(UnsupportedOpError, match="'n'.*'gelu'"):
        kiln.build(model, kiln.BuildConfig(device=DEVICE))
