"""Precision assignment (--fp16, --bf16, --layer-precision, --keep-io-precision): choose each layer's
compute type and make the typed IR say so, with explicit Cast layers and constants converted at build time.

    x: f32 ─▶ Conv(x, W: f32) ─▶ y: f32 ─▶ Relu ─▶ out: f32                       (--fp16 ⇒)
    x: f32 ─▶ Cast ─▶ Conv@f16(·, W: f16) ─▶ y: f16 ─▶ Relu@f16 ─▶ out__1: f16 ─▶ Cast ─▶ out: f32

A layer runs reduced when its kind allows it (policy.py) and its float data are float32, or when
--layer-precision names it. An activation gets one Cast per type it is read in, shared by its readers;
a constant read in two types is duplicated. Values beyond the reduced type's range are clamped
to its largest finite value, as TensorRT does with weights, so that -3.4e38 mask constants stay finite.
"""

from __future__ import annotations

import difflib

import torch

from kiln.config import BuildConfig
from kiln.errors import ConfigError
from kiln.ir import DType, Layer, Network
from kiln.kinds.verify import verify_network
from kiln.quant.casts import remove_redundant_casts
from kiln.quant.policy import READS_ANY, allowed, denied, is_data_input, is_data_output

F32 = DType.FLOAT32
BY_NAME = {"fp32": F32, "tf32": F32, "fp16": DType.FLOAT16, "bf16": DType.BFLOAT16}


def apply_precision(net: Network, config: BuildConfig) -> list[str]:
    """Assign layer precisions per `config`, in place; returns notes for the build summary."""
    notes = _flag_notes(config)
    flag = DType.FLOAT16 if config.fp16 else DType.BFLOAT16 if config.bf16 else None
    asked = _overrides(net, config.layer_precisions)
    if flag is None and not asked:
        return notes
    targets = {layer.name: t for layer in net.layers if (t := _target(net, layer, flag, asked.get(layer.name)))}
    layers = len(net.layers)
    rewrite = _Rewrite(net, targets, None if config.keep_io_precision else flag)
    rewrite.run()
    bypassed = remove_redundant_casts(net)
    verify_network(net)
    counts = {d: sum(t is d for t in targets.values()) for d in set(targets.values())}
    reduced = ", ".join(f"{n} in {d}" for d, n in sorted(counts.items(), key=str)) or "none reduced"
    notes.append(f"precision: of {layers} layers, {reduced}; {rewrite.casts} casts inserted, {bypassed} redundant "
                 f"casts removed, {rewrite.converted} constants converted")
    if rewrite.clamped:
        notes.append(f"precision: {rewrite.clamped} constant values beyond the reduced type's range were clamped to "
                     "its largest finite value; pin the layers that read them with --layer-precision NAME=fp32 "
                     "if that matters")
    return notes


def _flag_notes(config: BuildConfig) -> list[str]:
    notes = []
    if config.tf32:
        notes.append("--tf32: float32 matmuls and convolutions may use TF32 tensor cores (10-bit mantissa, "
                     "fp32 accumulate); tensor types are unchanged")
    return notes


def _overrides(net: Network, asked: dict[str, str]) -> dict[str, DType]:
    """--layer-precision by layer name (or the name of an ONNX node fused into a layer) → type."""
    by_name = {layer.name: layer.name for layer in net.layers}
    for layer in net.layers:
        for node in layer.origin:
            by_name.setdefault(node, layer.name)
    out: dict[str, DType] = {}
    for name, precision in asked.items():
        if name not in by_name:
            close = difflib.get_close_matches(name, list(by_name), n=3)
            hint = f"did you mean {', '.join(map(repr, close))}?" if close else "`kiln inspect` lists the layer names"
            raise ConfigError(f"--layer-precision names no layer {name!r}; {hint}")
        if precision not in BY_NAME:
            raise ConfigError(f"--layer-precision {name}={precision}: a layer can be pinned to one of "
                              f"{', '.join(BY_NAME)}")
        layer = by_name[name]
        if out.get(layer, BY_NAME[precision]) is not BY_NAME[precision]:
            raise ConfigError(f"--layer-precision gives layer {layer!r} two precisions; give it one")
        out[layer] = BY_NAME[precision]
    return out


def _target(net: Network, layer: Layer, flag: DType | None, asked: DType | None) -> DType | None:
    """The reduced type `layer` computes in, or None to leave it as it is."""
    if asked is None:
        return flag if flag and allowed(layer) and _eligible(net, layer) else None
    if asked is F32:
        return None
    if denied(layer) or not _eligible(net, layer):
        why = "its kind has fp32-only semantics" if denied(layer) else "its float data are not float32 tensors"
        raise ConfigError(f"--layer-precision: layer {layer.name!r} ({layer.kind}) cannot run in {asked}: {why}; "
                          "drop that --layer-precision")
    return asked


def _eligible(net: Network, layer: Layer) -> bool:
    """The layer has float data, all of it plain float32 tensors."""
    data = [n for k, n in enumerate(layer.inputs) if n and is_data_input(layer.kind, k)]
    data += [n for k, n in enumerate(layer.outputs) if n and is_data_output(layer.kind, k)]
    floats = [net.tensors[n] for n in data if net.tensors[n].dtype.is_float]
    return bool(floats) and all(t.dtype is F32 and t.kind == "tensor" for t in floats)


class _Rewrite:
    """One walk over the layers that retypes tensors and inserts casts (module docstring)."""

    def __init__(self, net: Network, targets: dict[str, DType], io: DType | None):
        self.net, self.targets, self.io = net, targets, io
        self.declared = {n: t.dtype for n, t in net.tensors.items()}  # the types before the rewrite
        self.home: dict[str, str] = {}  # network outputs renamed: their value as computed
        self.versions: dict[str, dict[DType, str]] = {}  # a tensor's value in other types
        self.layers: list[Layer] = []
        self.casts = self.converted = self.clamped = 0

    def run(self) -> None:
        net = self.net
        for name in net.inputs:
            net.tensors[name].dtype = self.io_type(name)
        self.convert_constants()
        for layer in net.layers:
            layer.inputs = [self.obtain(n, self.wanted(layer, k)) if n else n for k, n in enumerate(layer.inputs)]
            self.layers.append(layer)
            target = self.targets.get(layer.name)
            if target:
                layer.precision = target
                for k, o in enumerate(layer.outputs):
                    if o and self.declared[o] is F32 and is_data_output(layer.kind, k):
                        net.tensors[o].dtype = target
            for o in layer.outputs:
                if o in net.outputs:
                    self.fix_output(layer, o)
        net.layers = self.layers

    def io_type(self, name: str) -> DType:
        """The type network input or output `name` must have."""
        t = self.net.tensors[name]
        return self.io if self.io and self.declared[name] is F32 and t.kind == "tensor" else self.declared[name]

    def wanted(self, layer: Layer, k: int) -> DType | None:
        """The type `layer` reads its k-th input in; None: whatever type it has."""
        name = layer.inputs[k]
        declared, t = self.declared[name], self.net.tensors[name]
        if layer.kind in READS_ANY or not declared.is_float or t.kind != "tensor":
            return None
        target = self.targets.get(layer.name)
        return target if target and declared is F32 and is_data_input(layer.kind, k) else declared

    def convert_constants(self) -> None:
        """Give each float32 constant the type its readers want; duplicate it when they want several."""
        net = self.net
        wants: dict[str, set[DType]] = {o: set() for o in net.outputs if o in net.constants}
        for layer in net.layers:
            for k, n in enumerate(layer.inputs):
                if n in net.constants and (w := self.wanted(layer, k)):
                    wants.setdefault(n, set()).add(w)
        for name, types in wants.items():
            own = self.io_type(name) if name in net.outputs else next(iter(types)) if len(types) == 1 else F32
            for t in types - {own}:
                copy = net.unique_name(f"{name}_{t}")
                net.add_constant(copy, self.convert(net.constants[name], t))
                self.versions.setdefault(name, {})[t] = copy
            if own is not net.tensors[name].dtype:
                net.constants[name] = self.convert(net.constants[name], own)
                net.tensors[name].dtype = own

    def convert(self, value: torch.Tensor, to: DType) -> torch.Tensor:
        """`value` in type `to`, finite values clamped to its range."""
        self.converted += 1
        big = torch.finfo(to.torch).max
        lo, hi = torch.aminmax(value) if value.numel() else (0, 0)
        if -big <= lo and hi <= big:
            return value.to(to.torch, copy=True)  # never a view: plans refuse constants sharing memory
        beyond = (value.abs() > big) & value.isfinite()
        self.clamped += int(beyond.sum())
        return torch.where(beyond, value.clamp(-big, big), value).to(to.torch)

    def obtain(self, name: str, want: DType | None) -> str:
        """A tensor holding `name`'s value in type `want`, casting it once on first need."""
        home = self.home.get(name, name)
        if want is None or self.net.tensors[home].dtype is want:
            return home
        versions = self.versions.setdefault(name, {})
        if want not in versions:
            versions[want] = self.cast(home, want)
        return versions[want]

    def cast(self, src: str, to: DType, dst: str | None = None) -> str:
        """Append a Cast of `src` to type `to`, writing `dst` (a fresh tensor by default)."""
        if dst is None:
            dst = self.net.unique_name(f"{src}_{to}")
            self.net.add_tensor(dst, to, self.net.tensors[src].shape)
        self.layers.append(Layer(self.net.unique_name(f"{dst}_cast"), "Cast", [src], [dst],
                                 {"to": to, "saturate": True, "round_mode": "up"}, origin=[]))
        self.casts += 1
        return dst

    def fix_output(self, layer: Layer, name: str) -> None:
        """Network output `name` keeps its required type: the layer writes a new tensor, cast into `name`."""
        t, want = self.net.tensors[name], self.io_type(name)
        if t.dtype is want:
            return
        inner = self.net.unique_name(name)
        self.net.add_tensor(inner, t.dtype, t.shape)
        layer.outputs = [inner if o == name else o for o in layer.outputs]
        t.dtype = want
        self.home[name] = inner
        self.versions.setdefault(name, {})[want] = name
        self.cast(inner, want, name)
