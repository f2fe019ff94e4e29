"""The plain interpreter: runs a network's layers in order, each through its kind's reference or a given kernel.

`run_layers` is the one executor: the runtime's execution contexts run an engine's compiled kernels through it,
control-flow references (If, Loop, Scan, SequenceMap) run their bodies through it via `run_network`, and
calibration and the accuracy budget (quant) run float and quantized networks through it.
Runtime values are torch tensors, numpy object arrays (strings), lists (sequences) and None
(empty optionals); only torch tensors are moved or converted.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.errors import InputError, KilnError
from kiln.ir import Layer, Network
from kiln.ir.dtype import move, to_numpy
from kiln.kinds.registry import run_reference

Kernel = Callable[..., list]  # a layer's compiled kernel: (inputs, out=None) → outputs (kiln.tactics.registry.Kernel)

Failure = Callable[[Layer, Exception], Exception]
Fallback = Callable[[int, Exception], Kernel | None]


def run_layers(net: Network, values: dict[str, Any], fail: Failure, release: list[list[str]] | None = None,
               keep: set[str] = frozenset(), kernels: list[Kernel] | None = None,
               buffers: list[list | None] | None = None, fallback: Fallback | None = None) -> None:
    """Run `net`'s layers in order over `values` (updated in place); `fail` turns a layer's error into ours.

    `kernels` (one per layer: the engine's compiled tactics) replace the layers' references where given;
    `buffers` (per layer: its outputs' places in the activation arena, or None) are handed to them as `out`;
    `fallback(step, error)` gives the kernel to retry a failed layer with (its reference), or None.
    """
    for step, layer in enumerate(net.layers):
        args = [values[n] if n else None for n in layer.inputs]
        try:
            if not kernels:
                outs = run_reference(layer.kind, args, layer.attrs)
            elif buffers and buffers[step] is not None:
                outs = kernels[step](args, out=buffers[step])
            else:
                outs = kernels[step](args)
        except InputError as e:  # a value fed at run time asks for too much (a shape, a size): name what it read
            raise InputError(f"layer {layer.name!r} ({layer.kind}) reading {[n for n in layer.inputs if n]}: "
                             f"{e}") from None
        except KilnError:
            raise
        except (RuntimeError, ValueError, IndexError) as e:
            retry = fallback(step, e) if fallback is not None and kernels else None
            if retry is None:
                raise fail(layer, e) from e
            try:
                outs = retry(args)
            except (RuntimeError, ValueError, IndexError) as again:
                raise fail(layer, again) from again
        for name, value in zip(layer.outputs, outs):
            if name:
                values[name] = value
        for name in release[step] if release else ():
            if name not in keep:
                values.pop(name, None)


def run_network(net: Network, inputs: list[Any], device: torch.device) -> list[Any]:
    """Run a control-flow body on `device`: bind `inputs` to its inputs in order, return its outputs in order."""
    values = {k: to_device(v, device) for k, v in net.constants.items()}
    values.update(zip(net.inputs, inputs))
    run_layers(net, values, _body_failure)
    return [values[n] for n in net.outputs]


def _body_failure(layer: Layer, e: Exception) -> Exception:
    """Re-raised as a RuntimeError so that the enclosing layer's handler names both layers."""
    return RuntimeError(f"in body layer {layer.name!r} ({layer.kind}): {first_line(e)}")


def first_line(e: Exception) -> str:
    """An error's first line (its type name when it has no message)."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def to_device(value: Any, device: torch.device | str) -> Any:
    """Move torch tensors (also inside sequences) to `device`; strings and None stay where they are."""
    if isinstance(value, torch.Tensor):
        return value if value.device == torch.device(device) else move(value, device, non_blocking=True)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    return value




def to_host(value: Any) -> Any:
    """Runtime value → numpy side: tensors become numpy arrays, sequences lists of them."""
    if isinstance(value, torch.Tensor):
        return to_numpy(value)
    if isinstance(value, list):
        return [to_host(v) for v in value]
    return value
