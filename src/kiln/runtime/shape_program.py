"""The shape program of a dynamic engine: its shape arithmetic, evaluated once per input signature.

Exporters compute reshape targets, position ranges and masks from `Shape` of the inputs. Those layers
(Shape, Size and every layer reading only their results and constants) depend on the input shapes alone,
so the engine runs them once per signature and memoizes their values: host copies for the inputs that
kernels read on the host (shapes, axes, sizes), device copies for the rest. Later runs at that signature
run only the data layers (`run_net`): no device tensor is read on the host, and the run can be captured
in a CUDA graph, as a static engine's is.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from kiln.builder.specialize import DATA_DEPENDENT, SHAPE_INPUTS
from kiln.ir import Layer, Network
from kiln.runtime.memory_plan import plan_memory

SHAPE_OF = ("Shape", "Size")
RANDOM = ("RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial", "Bernoulli")
HOST_SUFFIX = "@host"  # a run layer reads the host copy of a shape value through this name
MAX_SIGNATURES = 4096  # memoized signatures per engine (a captured graph keeps its own entry alive)

Signature = tuple


def input_signature(inputs: dict, dtypes: dict | None = None) -> Signature:
    """What the shape values depend on: every input's shape and dtype (`dtypes`: declared ones for inputs held in
    another, as a graph's static buffers of folded Casts are)."""
    dtypes = dtypes or {}
    return tuple((k, tuple(v.shape), dtypes.get(k, v.dtype)) for k, v in sorted(inputs.items()))


@dataclass(frozen=True)
class ShapeValues:
    """One signature's shape values, as the run network reads them (device copies and `name@host` host copies)."""

    values: dict[str, torch.Tensor]


class ShapeProgram:
    """Which layers are shape arithmetic, the network left to run without them, and the memo of their values."""

    def __init__(self, net: Network, device: torch.device | str):
        self.net, self.device = net, torch.device(device)
        self.steps = shape_steps(net)
        self.names = {o for k in self.steps for o in net.layers[k].outputs if o}
        self.run_steps = [k for k in range(len(net.layers)) if k not in self.steps]
        self.run_net, self.host_reads, self.device_reads = _run_network(net, self.steps, self.names)
        self.release = plan_memory(self.run_net).release if self.steps else []
        self._memo: OrderedDict[Signature, ShapeValues] = OrderedDict()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.steps)

    def lookup(self, signature: Signature) -> ShapeValues | None:
        with self._lock:
            found = self._memo.get(signature)
            if found is not None:
                self._memo.move_to_end(signature)
            return found

    def record(self, signature: Signature, values: dict) -> ShapeValues:
        """Memoize the shape values a full run computed (reading them back to the host, once per signature)."""
        memo = {n: _on(values[n], self.device) for n in self.device_reads}
        memo.update({n + HOST_SUFFIX: values[n].cpu() if isinstance(values[n], torch.Tensor) else values[n]
                     for n in self.host_reads})
        entry = ShapeValues(memo)
        with self._lock:
            self._memo[signature] = entry
            while len(self._memo) > MAX_SIGNATURES:
                self._memo.popitem(last=False)
        return entry


def _on(value, device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


def shape_steps(net: Network) -> set[int]:
    """Indices of the layers whose outputs depend only on the input shapes (and constants)."""
    tainted = {n for n in net.inputs if net.tensors[n].kind != "tensor"}  # shapes not in the signature
    shaped: set[str] = set()  # values computed from input shapes and constants alone
    steps: set[int] = set()
    for k, layer in enumerate(net.layers):
        ins = [i for i in layer.inputs if i]
        outs = [o for o in layer.outputs if o]
        data_shape = any(layer.inputs[p] and layer.inputs[p] not in shaped and layer.inputs[p] not in net.constants
                         for p in SHAPE_INPUTS.get(layer.kind, ()) if p < len(layer.inputs))
        if layer.kind in DATA_DEPENDENT or data_shape or any(i in tainted for i in ins):
            tainted.update(outs)  # these outputs' shapes may depend on input values
            continue
        if layer.kind in SHAPE_OF:
            host = net.tensors[ins[0]].kind == "tensor"
        else:
            host = (layer.kind not in RANDOM and any(i in shaped for i in ins)
                    and all(i in shaped or i in net.constants for i in ins))
        if host and all(net.tensors[o].kind == "tensor" for o in outs):
            shaped.update(outs)
            steps.add(k)
    return steps


def _run_network(net: Network, steps: set[int], names: set[str]) -> tuple[Network, set[str], set[str]]:
    """(the network without the shape layers, shape values read on the host, shape values read on the device).

    A run layer reading a shape value where its kernel reads the host (SHAPE_INPUTS) reads `name@host`."""
    run = Network(net.name)
    run.inputs, run.outputs, run.constants = list(net.inputs), list(net.outputs), net.constants
    run.tensors = dict(net.tensors)
    host, device = set(), {n for n in net.outputs if n in names}
    for k, layer in enumerate(net.layers):
        if k in steps:
            continue
        at_host = SHAPE_INPUTS.get(layer.kind, ())
        inputs = []
        for p, name in enumerate(layer.inputs):
            if name in names and p in at_host:
                host.add(name)
                run.tensors.setdefault(name + HOST_SUFFIX, net.tensors[name])
                name += HOST_SUFFIX
            elif name in names:
                device.add(name)
            inputs.append(name)
        run.layers.append(layer if inputs == layer.inputs else
                          Layer(layer.name, layer.kind, inputs, layer.outputs, layer.attrs, layer.precision,
                                layer.origin))
    return run, host, device
