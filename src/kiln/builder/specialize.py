"""Shape specialization: with every input shape fixed, learn each intermediate's shape by running the network once.

ONNX shape inference cannot see through the shape arithmetic exporters write (Shape → Gather →
Range → Expand ...), so tensors downstream of it keep unknown dims even in a static build. One run
of the reference network on the build device with zero-filled inputs records the real shapes; the
folding passes then turn the shape arithmetic into constants and tactics see static shapes.
Layers whose output shape depends on data (NonZero, Unique, control flow ..., or a shape input
computed from the inputs' values) and everything after them keep the shapes inference gave.
"""

from __future__ import annotations

import itertools
from math import prod

import torch

from kiln.ir import Network
from kiln.kinds import run_reference
from kiln.kinds.interpret import to_device
from kiln.tactics.host_inputs import HOST_INPUTS

# inputs whose values decide the output shape (beyond those references read on the host)
SHAPE_INPUTS = {**HOST_INPUTS, "ConstantOfShape": (0,), "Range": (0, 1, 2), "RandomUniform": (0,),
                "RandomNormal": (0,)}
DATA_DEPENDENT = {"NonZero", "Unique", "Compress", "NonMaxSuppression", "If", "Loop", "Scan", "SequenceMap",
                  "StringSplit", "TfIdfVectorizer", "RandomUniform", "RandomNormal", "Multinomial"}


def needs_specialization(net: Network) -> bool:
    inputs_static = all(net.tensors[n].is_static for n in net.inputs)
    return inputs_static and any(not net.tensors[o].is_static for l in net.layers for o in l.outputs
                                 if o and getattr(net.tensors.get(o), "kind", "tensor") == "tensor")


def specialize_shapes(net: Network, device: str) -> int:
    """Record the shape of every data-independent tensor; returns how many tensors got a static shape."""
    learned = 0
    for name, shape in observe_shapes(net, device, {n: net.tensors[n].shape for n in net.inputs}).items():
        t = net.tensors.get(name)
        if t is not None and not t.is_static and getattr(t, "kind", "tensor") == "tensor":
            t.shape = shape
            learned += 1
    return learned


def observe_shapes(net: Network, device: str, input_shapes: dict[str, tuple]) -> dict[str, tuple]:
    """The shape every data-independent tensor takes when the inputs have `input_shapes` (one reference run on
    zeros); tensors whose shape depends on data, or that follow a layer failing on zeros, are left out."""
    values = {k: to_device(v, device) for k, v in net.constants.items()}
    for n in net.inputs:
        values[n] = torch.zeros(input_shapes[n], dtype=net.tensors[n].dtype.torch, device=device)
    tainted: set[str] = set()             # shapes depend on input data: not recorded
    from_data: set[str] = set(net.inputs)  # values depend on input data (zeros here stand in for them)
    shapes: dict[str, tuple] = {n: tuple(input_shapes[n]) for n in net.inputs}
    with torch.inference_mode():
        for layer in net.layers:
            args = [values.get(i) if i else None for i in layer.inputs]
            if any(i and i not in values for i in layer.inputs):
                tainted.update(o for o in layer.outputs if o)
                continue
            try:
                outs = run_reference(layer.kind, args, layer.attrs)
            except Exception:  # zeros are not valid data for every layer; its shapes stay unobserved
                tainted.update(o for o in layer.outputs if o)
                continue
            dependent = (layer.kind in DATA_DEPENDENT or any(i in tainted for i in layer.inputs if i)
                         or any(layer.inputs[k] in from_data for k in SHAPE_INPUTS.get(layer.kind, ())
                                if k < len(layer.inputs)))
            if layer.kind not in ("Shape", "Size") and any(i in from_data for i in layer.inputs if i):
                from_data.update(o for o in layer.outputs if o)
            for name, value in zip(layer.outputs, outs):
                if not name:
                    continue
                values[name] = value
                if dependent:
                    tainted.add(name)
                elif isinstance(value, torch.Tensor):
                    shapes[name] = tuple(value.shape)
    return shapes


def probe_points(profiles) -> list[dict[str, tuple]]:
    """Input shapes to observe a dynamic network at: each profile's min, opt and max, and one interior point
    (a third of the way up, plus one) whose dims are unlike any of those three."""
    points = []
    for p in profiles:
        odd = {n: tuple(min(lo + (hi - lo) // 3 + 1, hi) for lo, hi in zip(r.min, r.max)) for n, r in p.items()}
        points += [{n: r.min for n, r in p.items()}, {n: r.opt for n, r in p.items()},
                   {n: r.max for n, r in p.items()}, odd]
    return points


SPECIALIZE_BY = 16  # Triton compiles an integer argument apart when it is 1 and when it is a multiple of 16
MAX_CLASS_POINTS = 64


def _class_values(lo: int, hi: int) -> list[int]:
    """One value of [lo, hi] per class Triton compiles integers by, for a dim and for the products of dims kernels
    take (strides, element counts; 16x100's mask stride 100·100 is a multiple of 16, 16x17's is not): 1, and one
    value per count of factors of two, 0 to 3 and 4 or more (a multiple of 16)."""
    start, out = max(lo, 2), [1] if lo <= 1 <= hi else []
    for twos in range(5):
        step = 2 ** (twos + 1) if twos < 4 else SPECIALIZE_BY
        base = 2 ** twos if twos < 4 else 0
        v = start + (base - start) % step  # the least v >= start with v % step == base
        out += [v] if v <= hi else []
    return out


def _axes(profile) -> list[tuple[int, int]]:
    """A profile's varying ranges (lo, hi), each once: dims of one range (an input's batch and another's, say) move
    together, as the inputs' shapes must agree."""
    return sorted({(lo, hi) for r in profile.values() for lo, hi in zip(r.min, r.max) if lo < hi})


def _points(profile, axes, combos) -> list[dict[str, tuple]]:
    """The profile's input shapes with each range of `axes` at its value in each combo (other dims at their min)."""
    out = []
    for combo in combos:
        value = dict(zip(axes, combo))
        out.append({n: tuple(value.get((lo, hi), lo) for lo, hi in zip(r.min, r.max)) for n, r in profile.items()})
    return out


def class_points(profile) -> list[dict[str, tuple]]:
    """Input shapes that meet every combination of the classes (`_class_values`) of a profile's varying dims, so a
    warm-up there compiles each kernel for every class a later shape can fall in; at most MAX_CLASS_POINTS."""
    axes = _axes(profile)
    combos = itertools.islice(itertools.product(*(_class_values(lo, hi) for lo, hi in axes)), MAX_CLASS_POINTS)
    return _points(profile, axes, combos) if axes else []


MAX_EVERY_POINTS = 128


def every_point(profile, limit: int = MAX_EVERY_POINTS) -> list[dict[str, tuple]]:
    """Every input shape of a profile, or [] when it has none varying or more than `limit`: the shapes a warm-up
    runs where a library plans per shape (cuDNN convs), so no later call waits for a plan."""
    axes = _axes(profile)
    if not axes or prod(hi - lo + 1 for lo, hi in axes) > limit:
        return []
    return _points(profile, axes, itertools.product(*(range(lo, hi + 1) for lo, hi in axes)))


def refine_shapes(net: Network, profiles, device: str) -> int:
    """Give a dynamic network's tensors the shapes observed over its profiles' range: a dim with one value at
    every probe point becomes that int, a dim that follows an input's symbolic dim takes its symbol (ONNX shape
    inference leaves `unk__` dims behind computed reshapes). Returns how many tensors changed."""
    dynamic = [n for n in net.inputs if not net.tensors[n].is_static]
    if not profiles or not dynamic or any(n not in p for p in profiles for n in dynamic) \
            or any(getattr(net.tensors[n], "kind", "tensor") != "tensor" for n in net.inputs):
        return 0
    points = [{n: (net.tensors[n].shape if net.tensors[n].is_static else point[n]) for n in net.inputs}
              for point in probe_points(profiles)]
    try:
        seen = [observe_shapes(net, device, point) for point in points]
    except (RuntimeError, MemoryError):  # a profile too large to run here: the shapes stay as inference gave them
        return 0
    symbol: dict[tuple, str] = {}  # the values an input's symbolic dim takes at the probe points → its name
    for n in dynamic:
        for i, d in enumerate(net.tensors[n].shape):
            if isinstance(d, str):
                symbol.setdefault(tuple(point[n][i] for point in points), d)
    changed = 0
    for name, t in net.tensors.items():
        shapes = [s.get(name) for s in seen]
        if getattr(t, "kind", "tensor") != "tensor" or t.is_static or any(s is None for s in shapes) \
                or len({len(s) for s in shapes}) != 1 or t.shape is not None and len(t.shape) != len(shapes[0]):
            continue
        old = t.shape or (None,) * len(shapes[0])
        dims = []
        for i, was in enumerate(old):
            values = tuple(s[i] for s in shapes)
            dims.append(values[0] if len(set(values)) == 1 else symbol.get(values, was))
        if None not in dims and tuple(dims) != tuple(old):
            t.shape = tuple(dims)
            changed += 1
    return changed
