"""ONNX importers for the recurrent ops LSTM, GRU and RNN.

Activation lists are resolved here: one entry per activation per direction, with
activation_alpha/activation_beta consumed in order by the activations that take them
(as ONNX Runtime does) and ONNX's per-activation defaults filled in for the rest.
"""

from __future__ import annotations

from kiln.errors import ModelError, UnsupportedOpError
from kiln.frontend.onnx.registry import ImportContext, OnnxNode, register, schema_defaults
from kiln.kinds.rnn import ACTIVATIONS

# op -> (default activations of one direction, extra attributes with their defaults)
_OPS = {
    "LSTM": (["sigmoid", "tanh", "tanh"], {"input_forget": 0}),
    "GRU": (["sigmoid", "tanh"], {"linear_before_reset": 0}),
    "RNN": (["tanh"], {}),
}

# activation -> defaults of the (alpha, beta) it takes
_PARAMS = {"affine": (1.0, 0.0), "leakyrelu": (0.01,), "thresholdedrelu": (1.0,), "scaledtanh": (1.0, 1.0),
           "hardsigmoid": (0.2, 0.5), "elu": (1.0,)}


def _resolve_activations(node: OnnxNode, per_dir: list[str], dirs: int) -> dict:
    names = [n.lower() for n in node.attrs.get("activations", per_dir)]
    if len(names) == len(per_dir) and dirs == 2:
        names = names * 2
    if len(names) != len(per_dir) * dirs:
        raise ModelError(f"{node.where()}: expected {len(per_dir) * dirs} activations "
                         f"({len(per_dir)} per direction), got {len(names)}")
    alphas, betas = list(node.attrs.get("activation_alpha", [])), list(node.attrs.get("activation_beta", []))
    out_a, out_b = [], []
    for name in names:
        if name not in ACTIVATIONS:
            raise UnsupportedOpError(f"{node.where()}: activation {name!r} is not supported; "
                                     f"use one of {', '.join(sorted(ACTIVATIONS))}")
        defaults = _PARAMS.get(name, ())
        alpha, beta = (*defaults, 0.0, 0.0)[:2]
        if len(defaults) > 0 and alphas:
            alpha = float(alphas.pop(0))
        if len(defaults) > 1 and betas:
            beta = float(betas.pop(0))
        out_a.append(alpha)
        out_b.append(beta)
    return {"activations": names, "activation_alpha": out_a, "activation_beta": out_b}


def _importer(op: str):
    per_dir, extras = _OPS[op]

    def importer(node: OnnxNode, ctx: ImportContext) -> None:
        a = schema_defaults(node)
        a.update(node.attrs)
        direction = a.get("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ModelError(f"{node.where()}: direction {direction!r} is not forward, reverse or bidirectional")
        layout = a.get("layout", 0)
        if layout not in (0, 1):
            raise UnsupportedOpError(f"{node.where()}: layout={layout} is not 0 or 1")
        dirs = 2 if direction == "bidirectional" else 1
        w = ctx.network.tensors.get(node.inputs[1])
        if w is not None and w.shape and isinstance(w.shape[0], int) and w.shape[0] != dirs:
            raise ModelError(f"{node.where()}: W has {w.shape[0]} directions but direction={direction!r}")
        clip = a.get("clip")
        attrs = {"direction": direction, "layout": layout, "clip": None if clip is None else float(clip),
                 **_resolve_activations(node, per_dir, dirs), **{k: a.get(k, v) for k, v in extras.items()}}
        ctx.emit(node, op, node.inputs, node.outputs, attrs)

    return importer


for _op in _OPS:  # later opsets only add layout (14) and types (22); a missing attribute takes its default
    register(_op, since=1)(_importer(_op))
