"""The per-kind checks of a network: every layer of a registered kind, with the attributes its kind declares, and
control-flow bodies that fit their layer (plans are untrusted). The IR's own `Network.verify` checks the dataflow
only; `verify_network` runs both.
"""

from __future__ import annotations

from kiln.errors import InternalError
from kiln.ir import Layer, Network
from kiln.kinds import registry
from kiln.kinds.controlflow import BODIES


def verify_network(net: Network) -> None:
    """Raise InternalError unless every tensor is defined once, before use, with a type, and every layer has the
    attributes its kind declares (bodies too)."""
    net.verify(check_layer=verify_layer)


def verify_layer(layer: Layer) -> None:
    """Raise InternalError unless the layer's kind is registered, its bodies fit it and its attributes are those its
    kind declares."""
    if layer.kind not in registry.KINDS:
        raise InternalError(f"layer {layer.name!r} has unregistered kind {layer.kind!r}")
    verify_bodies(layer)
    problem = registry.attr_problem(layer.kind, layer.attrs)
    if problem:
        raise InternalError(f"layer {layer.name!r} ({layer.kind}): {problem}")


def verify_bodies(layer: Layer) -> None:
    """Raise InternalError unless a body-holding layer's bodies and counts fit together (plans are untrusted)."""
    names = BODIES.get(layer.kind)
    if not names:
        return
    n_in, n_out = len(layer.inputs), len(layer.outputs)
    fixed = {"If": 1, "Loop": 2}.get(layer.kind, 0)  # inputs before the carried, scanned or mapped ones
    captures = n_in - 1 if layer.kind == "If" else layer.attrs.get("captures")
    if not isinstance(captures, int) or not 0 <= captures <= n_in - fixed:
        raise InternalError(f"layer {layer.name!r} ({layer.kind}): captures={captures!r} does not fit "
                            f"its {n_in} inputs")
    if layer.kind == "Scan":
        _verify_scan(layer, n_in - captures, n_out)
    want = {"If": (n_in - 1, n_out), "Loop": (n_in, n_out + 1)}.get(layer.kind, (n_in, n_out))
    for name in names:
        body = layer.attrs.get(name)
        if not isinstance(body, Network):
            raise InternalError(f"layer {layer.name!r} ({layer.kind}): attribute {name!r} is not a network")
        if (len(body.inputs), len(body.outputs)) != want:
            raise InternalError(f"layer {layer.name!r} ({layer.kind}): body {name!r} has {len(body.inputs)} inputs "
                                f"and {len(body.outputs)} outputs, expected {want[0]} and {want[1]}")
        verify_network(body)


def _verify_scan(layer: Layer, n_in: int, n_out: int) -> None:
    """Scan's attribute lists: one entry per scan input and per scan output."""
    a = layer.attrs
    m = a.get("num_scan_inputs")
    k = n_out - (n_in - m) if isinstance(m, int) else -1
    lists = {"scan_input_axes": m, "scan_input_directions": m, "scan_output_axes": k, "scan_output_directions": k}
    if not (isinstance(m, int) and 0 < m <= n_in and k >= 0 and isinstance(a.get("batched"), bool)
            and all(isinstance(a.get(key), list) and len(a[key]) == count for key, count in lists.items())):
        raise InternalError(f"layer {layer.name!r} (Scan): attributes do not fit its {n_in} scanned/state inputs "
                            f"and {n_out} outputs")
