"""An execution context: runs an engine's layers on its device, one context per thread or stream.

The context runs the engine's compiled kernels through the one executor, `kiln.kinds.interpret.run_layers`
(with the activation arena, a CUDA graph per input signature, and a reference fallback per layer).
Runtime values are torch tensors, numpy object arrays (strings), lists (sequences) and None
(empty optionals); only torch tensors are moved or converted.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Mapping

import torch

from kiln.errors import InputError, InternalError, ResourceLimitError
from kiln.ir import Layer, Tensor
from kiln.ir.dtype import DType
from kiln.kinds.interpret import first_line, run_layers, to_device, to_host
from kiln.runtime.arena import Arena
from kiln.runtime.boundary_casts import passthrough
from kiln.runtime.cuda_graph import DEFAULT_MAX_GRAPHS, GraphCache, signature
from kiln.runtime.io import as_torch, bind_outputs, check_bound, check_feeds, check_indices, fetch, index_bounds, upload
from kiln.runtime.nvtx import ranged_kernels
from kiln.runtime.shape_program import input_signature
from kiln.tactics.registry import Kernel, reference_kernel
from kiln.tactics.spec import layer_spec


def feed_key(feeds: Any) -> tuple | None:
    """What makes a call's feeds replay the same graph: each one's name, shape, dtype and device, in the caller's
    order; None unless every feed is a CUDA tensor."""
    if not isinstance(feeds, dict) or not all(isinstance(v, torch.Tensor) and v.is_cuda for v in feeds.values()):
        return None
    return tuple((k, v.shape, v.dtype, v.device) for k, v in feeds.items())


class KernelFallbackWarning(RuntimeWarning):
    """A compiled kernel failed at run time and the layer's reference ran instead (a bug in kiln)."""

def _dense(value: Any) -> Any:
    return value.contiguous() if isinstance(value, torch.Tensor) else value


def _feed_value(t: Tensor, value: Any) -> tuple[Any, bool]:
    """(runtime value, was_numpy) for a sequence or optional input, checked against its declared type."""
    if t.kind.startswith("optional") and value is None:
        return None, False
    if t.kind in ("sequence", "optional_sequence"):
        if not isinstance(value, (list, tuple)):
            raise InputError(f"input {t.name!r}: expected a list of arrays (a sequence), got {type(value).__name__}")
        pairs = [_feed_element(t, v) for v in value]
        return [v for v, _ in pairs], any(n for _, n in pairs)
    return _feed_element(t, value)


def _feed_element(t: Tensor, value: Any) -> tuple[Any, bool]:
    v, was_numpy = as_torch(t.name, value)
    if DType.from_torch(v.dtype) != t.dtype:
        raise InputError(f"input {t.name!r}: expected elements of dtype {t.dtype}, got {v.dtype}")
    return v, was_numpy


class ExecutionContext:
    """Holds per-run state; the engine's weights are shared between contexts.

    `nvtx=True` wraps each layer's launch in an NVTX range named `kiln:<layer name> (<kind>)` for Nsight Systems;
    NVTX ranges are recorded at launch, so the layers then run eagerly, without CUDA graph replay.
    """

    def __init__(self, engine, cuda_graph: bool | None = None, nvtx: bool = False,
                 max_cuda_graphs: int = DEFAULT_MAX_GRAPHS, profile: int | str = "auto"):
        self.engine = engine
        if profile != "auto":  # "auto": chosen by each run's input shapes
            count = max(1, len(engine.config.profiles))
            if isinstance(profile, bool) or not isinstance(profile, int) or not 0 <= profile < count:
                raise InputError(f"profile={profile!r}: give \"auto\" or an optimization profile index, "
                                 f"0..{count - 1} (this engine has {count})")
        self.profile = profile
        cuda = engine.device.backend == "cuda"
        use_graph = engine.config.cuda_graph if cuda_graph is None else cuda_graph
        self.stream = torch.cuda.Stream() if cuda else None
        # NVTX ranges are recorded at launch, never by a graph replay: with them the layers run eagerly
        if isinstance(max_cuda_graphs, bool) or not isinstance(max_cuda_graphs, int) or max_cuda_graphs < 0:
            raise InputError(f"max_cuda_graphs must be a whole number >= 0, got {max_cuda_graphs!r}")
        use_graph = use_graph and max_cuda_graphs > 0
        self.casts = engine.boundary_casts  # the Casts its CUDA graphs leave to their replays' copies
        self.graphs = GraphCache(self.stream, max_cuda_graphs, self.casts) if cuda and use_graph and not nvtx else None
        self.nvtx = nvtx
        self._ranged = ranged_kernels(engine) if nvtx else None  # no per-layer wrapper unless asked for
        self.arena = Arena(engine)
        self.index_bounds = index_bounds(engine.network)
        self._seen: dict[tuple, tuple] = {}  # feed_key of feeds checked and captured → their graph's signature
        self._recorded = None  # the signature whose shape values the last run recorded on the capture stream

    def run(self, feeds: Mapping[str, Any], *, keep: set[str] | None = None, stream: torch.cuda.Stream | None = None,
            outputs: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Run the engine. numpy in → numpy out; torch or DLPack in → torch out (on the engine's device).

        `keep` names extra intermediate tensors to return as well (for debugging and `compare --mark-all`).
        `stream` enqueues the whole run on that CUDA stream without added synchronization (as TensorRT's
        enqueueV3); without it, device tensors at shapes this context has run replay its CUDA graph on the current
        stream (no checks again), other calls run on the context's stream, ordered after and before the current
        one. `outputs` binds preallocated device tensors to named outputs (ONNX Runtime's IOBinding).
        Sequence inputs are lists of arrays, optional inputs an array or None.
        The phases (`check`, `upload`, `execute`, `download`) are public so that `kiln bench` can time each.
        """
        if not keep and self.graphs is not None:
            key = feed_key(feeds)
            if key in self._seen:
                result = self._replay_seen(key, feeds, stream, outputs)
                if result is not None:
                    return result
        tensors, as_numpy = self.check(feeds)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            inputs = self.upload(tensors)
            result = self.execute(inputs, keep, stream=stream, outputs=outputs)
        if not keep and self.graphs is not None and signature(inputs) in self.graphs.runs:
            key = feed_key(feeds)
            if key is not None:  # keys of evicted graphs go, so the map stays as small as the graph cache
                self._seen = {k: sig for k, sig in self._seen.items() if sig in self.graphs.runs}
                self._seen[key] = signature(inputs)
        return self.download(result) if as_numpy else result

    def _replay_seen(self, key: tuple, feeds: Mapping[str, torch.Tensor], stream: torch.cuda.Stream | None,
                     outputs: Mapping[str, torch.Tensor] | None) -> dict[str, Any] | None:
        """The fast path: device feeds of a signature this context has checked and captured replay its graph with
        no checks again (at small shapes a call's Python is much of its latency); None if the graph was evicted."""
        captured = self.graphs.runs.get(self._seen[key])
        if captured is None:
            del self._seen[key]
            return None
        bound = check_bound(outputs, self.engine.network.outputs, self.engine.device.torch_device)
        self.graphs.runs.move_to_end(self._seen[key])
        if stream is None and torch.cuda.current_device() == self.stream.device_index:
            # the caller's current stream: ordered after and before its work as the context's own stream would be
            # with two event waits, which cost the host ~10 µs before the graph starts (a batch-1 call's latency)
            return captured.replay(feeds, bound)
        with torch.cuda.stream(stream or torch.cuda.current_stream(self.stream.device_index)):
            return captured.replay(feeds, bound)

    def check(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """(runtime values on the host or device as given, whether the caller used numpy), checked against the
        engine's inputs."""
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of input name → array, got {type(feeds).__name__}; the engine's "
                             f"inputs are {self.engine.network.inputs}")
        net = self.engine.network
        other = [net.tensors[n] for n in net.inputs if net.tensors[n].kind != "tensor"]
        plain = {k: v for k, v in feeds.items() if k not in {t.name for t in other}}
        tensors, as_numpy = check_feeds(plain, [net.tensors[n] for n in net.inputs if net.tensors[n].kind == "tensor"],
                                        self.engine.config.profiles)
        for t in other:
            if t.name not in feeds:
                raise InputError(f"wrong inputs: missing [{t.name!r}]; the engine expects {net.inputs}")
            tensors[t.name], was_numpy = _feed_value(t, feeds[t.name])
            as_numpy |= was_numpy
        check_indices(tensors, self.index_bounds)
        if self.profile != "auto":
            ranges = self.engine.config.profiles[self.profile] if self.engine.config.profiles else {}
            if not all(r.contains(tuple(tensors[n].shape)) for n, r in ranges.items() if n in tensors):
                raise InputError(f"input shapes {({n: list(tensors[n].shape) for n in ranges if n in tensors})} are "
                                 f"outside optimization profile {self.profile} "
                                 f"({', '.join(f'{n} {r}' for n, r in ranges.items())}) this context was made for; "
                                 "use create_context(profile=\"auto\") or the profile holding them")
        return tensors, as_numpy

    def _kernels(self, inputs: dict[str, Any]) -> list:
        """The kernels of the optimization profile these inputs run under (this context's, or the one holding
        their shapes)."""
        engine = self.engine
        if engine.profile_count < 2:
            return engine.kernels if self._ranged is None else self._ranged
        profile = self.profile if self.profile != "auto" else engine.select_profile(
            {n: tuple(v.shape) for n, v in inputs.items() if isinstance(v, torch.Tensor)})
        kernels = engine.kernels_for(profile)
        return kernels if not self.nvtx else ranged_kernels(engine, kernels=kernels)

    def upload(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Inputs onto the engine's device, host tensors through pinned staging buffers (asynchronous, on the
        current stream); device tensors are used as they are."""
        dev = self.engine.device.torch_device
        if self.stream is None:
            return {k: to_device(v, dev) for k, v in tensors.items()}
        return {k: upload(v, dev) for k, v in tensors.items()}

    def execute(self, inputs: dict[str, Any], keep: set[str] | None = None, *, stream: torch.cuda.Stream | None = None,
                outputs: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """The engine's kernels on device-resident inputs (a captured CUDA graph where possible); returns device
        values. By default on this context's stream, ordered after and before the caller's current stream;
        `stream`: enqueued on that stream with no synchronization added (the caller orders its inputs and outputs).
        `outputs`: preallocated tensors the named outputs are written into (returned in their place)."""
        keep = self._keep(keep)
        bound = check_bound(outputs, self.engine.network.outputs, self.engine.device.torch_device)
        if self.stream is None:
            return bind_outputs(self._run(inputs, keep), bound)
        caller = torch.cuda.current_stream(self.stream.device_index)
        run_on = stream or self.stream
        if stream is None:
            self.stream.wait_stream(caller)
        with torch.cuda.stream(run_on):
            result = self._replay(inputs, bound) if self.graphs is not None and not keep else None
        if result is None:
            if self.graphs is not None and self.graphs.failed_capture:
                self.stream = self.graphs.stream = torch.cuda.Stream()  # never reuse a stream a capture broke
                self.graphs.failed_capture = False
                if stream is None:
                    self.stream.wait_stream(caller)
                    run_on = self.stream
            with torch.cuda.stream(run_on):
                result = bind_outputs(self._run(inputs, keep), bound)
        if stream is None:
            caller.wait_stream(self.stream)
        return result

    def _replay(self, inputs: dict[str, Any], bound: dict[str, torch.Tensor]) -> dict[str, Any] | None:
        """Outputs from this signature's CUDA graph, or None where it runs eagerly. A dynamic engine's first run at a
        new signature runs eagerly, memoizing its shape values, and its outputs are that call's: the graph is
        captured at the signature's next run, so a shape met once never pays for a capture (torch's CUDA graph
        trees also run a shape before recording it)."""
        program, pin, warm = self.engine.shape_program, None, True
        if program and signature(inputs) is not None and self.graphs.capturable(inputs):
            pin = program.lookup(input_signature(inputs))
            if pin is None:
                result = bind_outputs(self._run(inputs), bound)
                on_capture_stream = torch.cuda.current_stream(self.graphs.stream.device_index) == self.graphs.stream
                self._recorded = signature(inputs) if on_capture_stream else None
                return result
            warm = signature(inputs) != self._recorded  # the record run just before was the capture's warm-up
            self._recorded = None
        return self.graphs.run(self._graph_run, inputs, bound, pin, warm)

    def _keep(self, keep) -> set[str]:
        """`keep` as a set of names of tensors the engine reads or computes, or an InputError naming the others."""
        if isinstance(keep, str) or not isinstance(keep, (set, frozenset, list, tuple, type(None))):
            raise InputError(f"keep must be a set of tensor names, got {keep!r}")
        keep = set(keep or ())
        if keep:
            net = self.engine.network
            known = set(net.inputs) | set(net.constants) | {o for layer in net.layers for o in layer.outputs if o}
            unknown = sorted(map(str, keep - known))
            if unknown:
                raise InputError(f"keep names {unknown}, which this engine does not compute; name tensors of its "
                                 f"network, e.g. {sorted(known - set(net.constants))[:5]}")
        return keep

    def fetch(self, result: dict[str, Any]) -> dict[str, Any]:
        """Start copying device outputs into pinned host buffers on the current stream; wait for the stream
        before reading them (`download` does both)."""
        return {n: fetch(v) for n, v in result.items()} if self.stream is not None else result

    def download(self, result: dict[str, Any]) -> dict[str, Any]:
        """Outputs as numpy arrays (sequences as lists of them), copied through pinned host buffers."""
        staged = self.fetch(result)
        if self.stream is not None:
            torch.cuda.current_stream().synchronize()
        return {n: to_host(v) for n, v in staged.items()}

    def _graph_run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """`_run` as a CUDA graph captures it: the boundary Casts pass their input through (the graph's static
        inputs are in the Casts' types, and its replay converts the outputs as it copies them out), and outputs in
        the arena are handed back uncopied (the replay copies every output once it has run)."""
        return self._run(inputs, graph=True)

    def _run(self, inputs: dict[str, Any], keep: set[str] = frozenset(), graph: bool = False) -> dict[str, Any]:
        """One eager pass over the engine's kernels; returns outputs (and the kept intermediates).

        A dynamic engine at a signature seen before runs only its data layers, reading the memoized shape values;
        at a new signature it runs every layer and memoizes them (its one host read-back per signature)."""
        engine, program = self.engine, self.engine.shape_program
        values: dict[str, Any] = dict(engine.weights)
        values.update(inputs)
        kernels = self._kernels(inputs)
        casts = self.casts
        if graph and casts.layers:
            kernels = [passthrough if k in casts.layers else kernel for k, kernel in enumerate(kernels)]
        buffers = None if keep else self.arena.buffers  # kept intermediates outlive their arena places
        known = program.lookup(input_signature(inputs, casts.declared if graph else None)) \
            if program and not keep else None
        with torch.inference_mode():
            if known is None:
                run_layers(engine.network, values, self._failure, engine.memory_plan.release,
                           keep | program.names if program else keep, kernels, buffers, self._fallback)
                if program and not keep:
                    program.record(input_signature(inputs), values)
            else:
                values.update(known.values)
                steps = program.run_steps
                run_layers(program.run_net, values, self._failure, program.release, keep,
                           [kernels[k] for k in steps], buffers and [buffers[k] for k in steps],
                           lambda step, e: self._fallback(steps[step], e))
        # layout layers may leave an output as a view (strided, or aliasing another value, arena memory included):
        # hand back dense tensors of their own
        names = list(engine.network.outputs) + sorted(keep - set(engine.network.outputs))
        return {n: values[n].clone() if self.arena.holds(values[n]) and not graph else _dense(values[n])
                for n in names}

    @property
    def eager_reasons(self) -> dict:
        """Input signatures that could not be captured in a CUDA graph, and why."""
        return dict(self.graphs.eager) if self.graphs is not None else {}

    def _fallback(self, step: int, e: Exception) -> Kernel | None:
        """A compiled tactic failed at run time: kiln's bug, not the user's shapes. Say so and hand back the
        layer's reference to run instead; None for a layer that already runs its reference."""
        engine = self.engine
        layer = engine.network.layers[step]
        if layer.name not in engine.compiled:
            return None
        warnings.warn(f"layer {layer.name!r} ({layer.kind}): tactic {engine.compiled[layer.name].name} failed at "
                      f"run time ({first_line(e)}); ran the layer's reference instead. This is a bug in kiln; "
                      "please report it with the model and input shapes", KernelFallbackWarning, stacklevel=2)
        spec = layer_spec(engine.network, layer, engine.weights, engine.config.tf32)
        return reference_kernel(spec)

    def _failure(self, layer: Layer, e: Exception) -> Exception:
        if isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e):
            return ResourceLimitError(f"layer {layer.name!r} ({layer.kind}) ran out of memory on "
                                      f"{self.engine.device.torch_device}: {first_line(e)}; use smaller inputs")
        if self.engine.has_dynamic_inputs:
            return InputError(f"layer {layer.name!r} ({layer.kind}) failed on these input shapes: "
                              f"{first_line(e)}; check the shapes agree with each other")
        return InternalError(f"layer {layer.name!r} ({layer.kind}) failed: {e}")
