"""Reference implementations of the sequence and optional layer kinds.

A sequence is a Python list of tensors and an empty optional is None. References return the
list of their outputs explicitly (`[seq]`), so that a sequence is never mistaken for several outputs.
"""

from __future__ import annotations

import torch

from kiln.errors import InputError
from kiln.kinds.controlflow import run_body
from kiln.kinds.registry import INT, NETWORK, kind


def _position(pos: torch.Tensor | None, length: int, default: int, inserting: bool = False) -> int:
    """An ONNX sequence position (negative counts from the back) checked against the sequence length."""
    p = default if pos is None else int(pos.reshape(-1)[0])
    p = p + length if p < 0 else p
    if not 0 <= p < length + inserting:
        raise IndexError(f"sequence position {p} is out of range for a sequence of {length} tensors")
    return p


@kind("SequenceConstruct", attrs={})
def sequence_construct(inputs, attrs):
    return [list(inputs)]


@kind("SequenceEmpty", attrs={"dtype": INT})
def sequence_empty(inputs, attrs):
    return [[]]


@kind("SequenceAt", attrs={})
def sequence_at(inputs, attrs):
    seq, pos = inputs
    return [seq[_position(pos, len(seq), 0)]]


@kind("SequenceInsert", attrs={})
def sequence_insert(inputs, attrs):
    seq, value, pos = (inputs + [None])[:3]
    out = list(seq)
    out.insert(_position(pos, len(seq), len(seq), inserting=True), value)
    return [out]


@kind("SequenceErase", attrs={})
def sequence_erase(inputs, attrs):
    seq, pos = (inputs + [None])[:2]
    out = list(seq)
    del out[_position(pos, len(seq), len(seq) - 1)]
    return [out]


@kind("SequenceLength", attrs={})
def sequence_length(inputs, attrs):
    return [torch.tensor(len(inputs[0]), dtype=torch.int64)]


@kind("SplitToSequence", attrs={"axis": INT.req, "keepdims": INT.req})
def split_to_sequence(inputs, attrs):
    x, split = (inputs + [None])[:2]
    axis = attrs["axis"]
    if split is None:
        parts = torch.split(x, 1, axis)
        return [[p.squeeze(axis) for p in parts] if not attrs["keepdims"] else list(parts)]
    return [list(torch.split(x, int(split) if split.dim() == 0 else split.tolist(), axis))]


@kind("ConcatFromSequence", attrs={"axis": INT.req, "new_axis": INT.req})
def concat_from_sequence(inputs, attrs):
    seq = inputs[0]
    if not seq:
        raise ValueError("ConcatFromSequence of an empty sequence")
    return [torch.stack(seq, attrs["axis"]) if attrs["new_axis"] else torch.cat(seq, attrs["axis"])]


@kind("SequenceMap", attrs={"body": NETWORK.req, "captures": INT.req})
def sequence_map(inputs, attrs):
    """Run the body once per position of the input sequences; tensor inputs go to every run unchanged."""
    body, captures = attrs["body"], attrs["captures"]
    mapped, captured = inputs[:len(inputs) - captures], inputs[len(inputs) - captures:]
    lengths = {len(v) for v in mapped if isinstance(v, list)}
    if len(lengths) > 1:
        raise ValueError(f"SequenceMap input sequences have different lengths {sorted(lengths)}")
    runs = [run_body(body, [v[i] if isinstance(v, list) else v for v in mapped] + captured, mapped[0][i].device)
            for i in range(len(mapped[0]))]
    return [list(column) for column in zip(*runs)] if runs else [[] for _ in body.outputs]


@kind("Optional", attrs={})
def optional(inputs, attrs):
    return [inputs[0] if inputs else None]


@kind("OptionalHasElement", attrs={})
def optional_has_element(inputs, attrs):
    return [torch.tensor(bool(inputs) and inputs[0] is not None)]


@kind("OptionalGetElement", attrs={})
def optional_get_element(inputs, attrs):
    if inputs[0] is None:
        raise InputError("OptionalGetElement: the optional is empty; check that the model gives it a value here")
    return [inputs[0]]
