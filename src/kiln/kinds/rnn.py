"""Reference implementations of the recurrent layer kinds: LSTM, GRU and RNN (ONNX semantics).

Shared attributes: direction ("forward", "reverse", "bidirectional"), layout (0: X is
(seq, batch, input); 1: (batch, seq, input)), clip (None, or the bound on every activation's
input), activations / activation_alpha / activation_beta (one entry per activation per
direction, alpha/beta already resolved by the importer). The input projection of every step
is one batched matmul; the recurrence then runs step by step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.kinds.registry import FLOAT, FLOATS, INT, NONE, STR, STRS, kind

ACTIVATIONS = {
    "relu": lambda x, a, b: torch.relu(x),
    "tanh": lambda x, a, b: torch.tanh(x),
    "sigmoid": lambda x, a, b: torch.sigmoid(x),
    "affine": lambda x, a, b: a * x + b,
    "leakyrelu": lambda x, a, b: F.leaky_relu(x, a),
    "thresholdedrelu": lambda x, a, b: torch.where(x > a, x, torch.zeros_like(x)),
    "scaledtanh": lambda x, a, b: a * torch.tanh(b * x),
    "hardsigmoid": lambda x, a, b: torch.clamp(a * x + b, 0, 1),
    "elu": lambda x, a, b: torch.where(x >= 0, x, a * torch.expm1(x)),
    "softsign": lambda x, a, b: x / (1 + x.abs()),
    "softplus": lambda x, a, b: F.softplus(x),
}


def _activations(attrs, direction: int, count: int, clipped: int):
    """The `count` activation functions of one direction; clip bounds the input of the first `clipped`.

    LSTM's output activation h(c) is not clipped: ONNX Runtime clips only the gate inputs.
    """
    lo = direction * count
    specs = zip(attrs["activations"][lo:lo + count], attrs["activation_alpha"][lo:lo + count],
                attrs["activation_beta"][lo:lo + count])
    fns = []
    for n, (name, a, b) in enumerate(specs):
        fn, clip = ACTIVATIONS[name], attrs["clip"] if n < clipped else None
        if clip is None:
            fns.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
        else:
            fns.append(lambda x, fn=fn, a=a, b=b, c=clip: fn(torch.clamp(x, -c, c), a, b))
    return fns


def _lstm_cell(acts, r, rb, p, attrs):
    f, g, h = acts
    pi, po, pf = (None, None, None) if p is None else p.chunk(3)

    def step(xw, state):
        h_prev, c_prev = state
        i_, o_, f_, c_ = (xw + h_prev @ r.T + rb).chunk(4, -1)
        if p is not None:
            i_, f_ = i_ + pi * c_prev, f_ + pf * c_prev
        i_ = f(i_)
        f_ = 1 - i_ if attrs["input_forget"] else f(f_)
        c = f_ * c_prev + i_ * g(c_)
        if p is not None:
            o_ = o_ + po * c
        return [f(o_) * h(c), c]

    return step


def _gru_cell(acts, r, rb, p, attrs):
    f, g = acts
    hidden = r.shape[-1]
    rz_r, r_h = r[:2 * hidden], r[2 * hidden:]
    rb_zr, rb_h = rb[:2 * hidden], rb[2 * hidden:]

    def step(xw, state):
        (h_prev,) = state
        xzr, xh = xw[..., :2 * hidden], xw[..., 2 * hidden:]
        z, rr = f(xzr + h_prev @ rz_r.T + rb_zr).chunk(2, -1)
        if attrs["linear_before_reset"]:
            cand = g(xh + rr * (h_prev @ r_h.T + rb_h))
        else:
            cand = g(xh + (rr * h_prev) @ r_h.T + rb_h)
        return [(1 - z) * cand + z * h_prev]

    return step


def _rnn_cell(acts, r, rb, p, attrs):
    (f,) = acts
    return lambda xw, state: [f(xw + state[0] @ r.T + rb)]


# op -> (cell factory, gates, activations per direction, clipped activations, states)
_CELLS = {"LSTM": (_lstm_cell, 4, 3, 2, 2), "GRU": (_gru_cell, 3, 2, 2, 1), "RNN": (_rnn_cell, 1, 1, 1, 1)}


def _run(op: str, inputs, attrs):
    """Run every direction of an LSTM/GRU/RNN; returns Y, Y_h (and Y_c for LSTM)."""
    make_cell, gates, n_acts, n_clipped, n_states = _CELLS[op]
    x, w, r, b, lens, *init = (list(inputs) + [None] * 8)[:8]
    init, p = init[:n_states], init[2] if op == "LSTM" else None
    if attrs["layout"]:
        x = x.transpose(0, 1)
        init = [None if s is None else s.transpose(0, 1) for s in init]
    steps, batch, _ = x.shape
    dirs, hidden = w.shape[0], r.shape[-1]
    if b is None:
        b = x.new_zeros(dirs, 2 * gates * hidden)
    lens = torch.full((batch,), steps, device=x.device) if lens is None else lens.to(x.device).long()
    t = torch.arange(steps, device=x.device).view(-1, 1)
    valid = (t < lens).unsqueeze(-1)  # (S, B, 1): steps past a sequence's length are padding
    ys, finals = [], []
    for d in range(dirs):
        reverse = attrs["direction"] == "reverse" or d == 1
        order = (lens - 1 - t).clamp(min=0) if reverse else t.expand(steps, batch)  # step -> time, per batch
        xs = x.gather(0, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        xw = xs @ w[d].T + b[d, :gates * hidden]
        cell = make_cell(_activations(attrs, d, n_acts, n_clipped), r[d], b[d, gates * hidden:],
                         None if p is None else p[d], attrs)
        state = [x.new_zeros(batch, hidden) if s is None else s[d] for s in init]
        out = []
        for s in range(steps):
            state = [torch.where(valid[s], n, o) for n, o in zip(cell(xw[s], state), state)]
            out.append(state[0])
        y = torch.stack(out)
        if reverse:
            y = y.gather(0, order.unsqueeze(-1).expand(-1, -1, hidden))
        ys.append(torch.where(valid, y, torch.zeros_like(y)))
        finals.append(state)
    y = torch.stack(ys, 1)  # (S, D, B, H)
    states = [torch.stack(s) for s in zip(*finals)]  # each (D, B, H)
    if attrs["layout"]:
        y, states = y.permute(2, 0, 1, 3), [s.transpose(0, 1) for s in states]
    return [y, *states]


@kind("LSTM", attrs={"activation_alpha": FLOATS.req, "activation_beta": FLOATS.req, "activations": STRS.req,
                     "clip": (FLOAT | NONE).req, "direction": STR.req, "hidden_size": INT, "input_forget": INT,
                     "layout": INT.req, "output_sequence": INT})
def lstm(inputs, attrs):
    """ONNX LSTM. Inputs: X, W, R, B, sequence_lens, initial_h, initial_c, P (peepholes i, o, f).
    Extra attr: input_forget (couples the gates: f = 1 - i). Outputs: Y, Y_h, Y_c."""
    return _run("LSTM", inputs, attrs)


@kind("GRU", attrs={"activation_alpha": FLOATS.req, "activation_beta": FLOATS.req, "activations": STRS.req,
                    "clip": (FLOAT | NONE).req, "direction": STR.req, "hidden_size": INT, "layout": INT.req,
                    "linear_before_reset": INT, "output_sequence": INT})
def gru(inputs, attrs):
    """ONNX GRU. Inputs: X, W, R, B, sequence_lens, initial_h. Extra attr: linear_before_reset
    (apply the reset gate after the recurrent matmul). Outputs: Y, Y_h."""
    return _run("GRU", inputs, attrs)


@kind("RNN", attrs={"activation_alpha": FLOATS.req, "activation_beta": FLOATS.req, "activations": STRS.req,
                    "clip": (FLOAT | NONE).req, "direction": STR.req, "hidden_size": INT, "layout": INT.req,
                    "output_sequence": INT})
def rnn(inputs, attrs):
    """ONNX RNN (Elman). Inputs: X, W, R, B, sequence_lens, initial_h. Outputs: Y, Y_h."""
    return _run("RNN", inputs, attrs)
