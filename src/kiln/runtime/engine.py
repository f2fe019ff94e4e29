"""The Engine: an optimized network bound to a device, its weights resident there."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import torch

from kiln.builder.build import Progress, build as build_pipeline
from kiln.builder.specialize import class_points, every_point, probe_points
from kiln.config import BuildConfig
from kiln.engine import compat, plan, signing
from kiln.engine.retune import retune
from kiln.engine.serialize import check_plugins, network_from_json, network_to_json, plugins_to_json
from kiln.errors import InputError, KilnError, PlanError
from kiln.ir import Network
from kiln.kinds.interpret import to_device
from kiln.runtime.boundary_casts import boundary_casts
from kiln.runtime.context import ExecutionContext
from kiln.runtime.cuda_graph import DEFAULT_MAX_GRAPHS
from kiln.runtime.io import select_profile
from kiln.runtime.memory_plan import plan_memory
from kiln.runtime.shape_program import ShapeProgram
from kiln.tactics import registry
from kiln.tactics.choice import Choice
from kiln.tactics.common import cudnn_search
from kiln.tactics.host_inputs import HOST_INPUTS, with_host_constants
from kiln.tactics.registry import Kernel
from kiln.tactics.spec import layer_spec
from kiln.target import hardware_compat
from kiln.target.device import Device
from kiln.util import files
from kiln.util.safe_json import printable


class Engine:
    """What `kiln.build` returns and `kiln.load` reads back: run it through `create_context()`."""

    def __init__(self, network: Network, config: BuildConfig, device: Device, *,
                 source_sha256: str = "", build_info: dict | None = None, header: dict | None = None,
                 tactics: dict[str, Choice] | None = None, tuned_for: dict | None = None,
                 profile_tactics: list[dict[str, Choice]] | None = None):
        self.network = network
        self.config = config
        self.device = device
        self.source_sha256 = source_sha256
        self.build_info = dict(build_info or {})
        self.header = header
        self.tuned_for = tuned_for or device.fingerprint()  # the device fingerprint its tactics were chosen on
        self.weights = {k: to_device(v, device.torch_device) for k, v in network.constants.items()}
        self.has_dynamic_inputs = any(not network.tensors[n].is_static for n in network.inputs)
        self.tactics = {l.name: (tactics or {}).get(l.name) or Choice(registry.REFERENCE) for l in network.layers}
        self.compiled: dict[str, registry.Tactic] = {}  # layer → the tactic its kernel came from
        start = time.perf_counter()
        self.kernels = [self._compile(layer) for layer in network.layers]
        # per optimization profile, its {layer: Choice} ([0] is `tactics`; a layer a profile omits takes profile 0's)
        # and the kernels of its layers whose choice differs from profile 0's (None: profile 0's kernel, shared)
        given = list(profile_tactics or ())[1:]
        self.profile_tactics = [self.tactics] + [
            {n: (given[k].get(n) if k < len(given) else None) or c for n, c in self.tactics.items()}
            for k in range(max(0, len(config.profiles) - 1))]
        self.profile_compiled = [self.compiled] + [{} for _ in self.profile_tactics[1:]]
        self._own_kernels: list[list[Kernel | None]] = [[None] * len(network.layers)]
        for k, choices in enumerate(self.profile_tactics[1:], 1):
            self._own_kernels.append([None if _same(choices[l.name], self.tactics[l.name])
                                      else self._compile(l, choices[l.name], self.profile_compiled[k])
                                      for l in network.layers])
        t, planned = self.compiled, time.perf_counter()
        # one plan serves every profile: an output is placed (its kernel handed `out`) only where the layer's kernel
        # takes one under every profile, and a layer is fresh only where it never aliases its inputs under any
        self.memory_plan = plan_memory(network, placed=self._in_every_profile(t, "writes_out"),
                                       fresh=self._in_every_profile(t, "fresh", "writes_out"))
        # seconds setting up: the chosen kernels compiled, the memory planned (the build's phase record reads them)
        self.setup_seconds = {"kernels": planned - start, "memory plan": time.perf_counter() - planned}
        self.shape_program = ShapeProgram(network, device.torch_device)
        self.boundary_casts = boundary_casts(network)  # the Casts a CUDA graph replay folds into its copies

    def _compile(self, layer, choice: Choice | None = None, compiled: dict | None = None) -> Kernel:
        """The layer's kernel from its chosen tactic (profile 0's unless `choice`; recorded in `compiled`); a tactic
        this GPU cannot run (a plan loaded under `--policy warn` elsewhere: fp8 on a GPU without fp8 tensor cores,
        say) or that no longer compiles falls back to the reference, with a note."""
        choice = choice or self.tactics[layer.name]
        compiled = self.compiled if compiled is None else compiled
        spec = layer_spec(self.network, layer, self.weights, self.config.tf32)
        if choice.tactic == registry.REFERENCE:
            host = {i: self.network.constants[n] for i, n in enumerate(layer.inputs)
                    if i in HOST_INPUTS.get(layer.kind, ()) and n in self.network.constants}
            kernel = registry.reference_kernel(spec)
            return with_host_constants(kernel, host) if host and self.device.backend == "cuda" else kernel
        try:
            tactic = registry.get(choice.tactic)
            why = (hardware_compat.tactic_reason(tactic, self.device) or tactic.supports(spec, self.device)) \
                if self.device.backend == "cuda" else None
            if why:
                raise RuntimeError(f"this GPU cannot run it: {why}")
            kernel = tactic.compile(spec, choice.config, self.device)
            compiled[layer.name] = tactic
            return kernel
        except Exception as e:  # recorded, and the engine still runs correctly
            self.build_info.setdefault("load_notes", []).append(
                f"layer {layer.name!r}: tactic {choice.tactic} failed to compile here ({type(e).__name__}: {e}); "
                "running the reference instead")
            return registry.reference_kernel(spec)

    def _in_every_profile(self, compiled: dict[str, registry.Tactic], *flags: str) -> set[str]:
        """The layers whose kernel comes, under every optimization profile, from a tactic with one of `flags` set
        (profile 0's are `compiled`; another profile's own kernel that is no compiled tactic is a reference)."""
        def has(tactic) -> bool:
            return tactic is not None and any(getattr(tactic, f) for f in flags)

        names = {n for n, t in compiled.items() if has(t)}
        for k, own in enumerate(self._own_kernels[1:], 1):
            names -= {l.name for l, kernel in zip(self.network.layers, own)
                      if kernel is not None and not has(self.profile_compiled[k].get(l.name))}
        return names

    @property
    def profile_count(self) -> int:
        """How many optimization profiles the engine has (1 for an engine built without profiles)."""
        return len(self.profile_tactics)

    def kernels_for(self, profile: int) -> list[Kernel]:
        """The layers' kernels under optimization profile `profile` (an index; profile 0's kernel object where the
        choice is the same); an InputError for an index out of range."""
        if isinstance(profile, bool) or not isinstance(profile, int) or not 0 <= profile < self.profile_count:
            raise InputError(f"optimization profile {profile!r} does not exist: this engine has "
                             f"{self.profile_count}, 0..{self.profile_count - 1}")
        own = self._own_kernels[profile]
        return [k if k is not None else self.kernels[i] for i, k in enumerate(own)]

    def select_profile(self, shapes: dict[str, tuple]) -> int:
        """The optimization profile for these input shapes: the one holding them; of several, the one whose opt
        shapes are nearest (see `kiln.runtime.io.select_profile`); an InputError naming every profile's range when
        none holds them."""
        return select_profile({n: tuple(s) for n, s in shapes.items()}, self.config.profiles)

    def tactic_summary(self) -> dict[str, int]:
        """How many layers run with each tactic."""
        counts: dict[str, int] = {}
        for c in self.tactics.values():
            counts[c.tactic] = counts.get(c.tactic, 0) + 1
        return counts

    @property
    def inputs(self):
        return [self.network.tensors[n] for n in self.network.inputs]

    @property
    def outputs(self):
        return [self.network.tensors[n] for n in self.network.outputs]

    def create_context(self, *, nvtx: bool = False, max_cuda_graphs: int = DEFAULT_MAX_GRAPHS,
                       profile: int | str = "auto") -> ExecutionContext:
        """A new execution context; `nvtx=True`: each layer's launch is an NVTX range named after the layer, for
        Nsight Systems, and the layers run eagerly (ranges are recorded at launch, never by a CUDA graph replay).
        `max_cuda_graphs`: how many input signatures keep a captured CUDA graph (least recently used go first).
        `profile`: the optimization profile's index, or "auto" to pick it from each run's input shapes."""
        return ExecutionContext(self, nvtx=nvtx, max_cuda_graphs=max_cuda_graphs, profile=profile)

    def run(self, feeds):
        """One-off convenience: a fresh context's run."""
        return self.create_context().run(feeds)

    @classmethod
    def build(cls, model, config: BuildConfig | None = None, progress: Progress | None = None, calib_data=None,
              validation_data=None, base_dir: str | os.PathLike | None = None) -> "Engine":
        """Build an engine for the best device present (or `config.device`) from an ONNX model (the builder's
        pipeline, its tuned network made into this class). `base_dir`: the folder holding the external data of a
        model given as bytes or a ModelProto."""
        engine = build_pipeline(model, config, progress, calib_data, validation_data, base_dir, make_engine=cls)
        engine.warm_up()
        return engine

    def warm_up(self) -> None:
        """Run a GPU engine on zeros at its shapes, so a first call at a new shape compiles and searches nothing: a
        static engine's one, and each profile's min, opt, max, one interior shape and a shape per combination of
        its dims' size classes (`class_points`: 1, and 0 to 4+ factors of two, which decide the 1 / multiple-of-16
        classes Triton compiles sizes and their products by), with cuDNN's algorithm search on (its timed picks). A
        profile whose layers plan per shape (cuDNN convs: ms each) also runs every other shape it holds, up to
        MAX_EVERY_POINTS, with cuDNN's heuristic pick, as a first call there would (`every_point`)."""
        net = self.network
        if self.device.backend != "cuda" or any(net.tensors[n].kind != "tensor" for n in net.inputs) \
                or (self.has_dynamic_inputs and not self.config.profiles):
            return
        start = time.perf_counter()
        if not self.has_dynamic_inputs:
            searched, planned = [("auto", {})], []
        else:
            searched = [(k, x) for k, p in enumerate(self.config.profiles)
                        for x in _unique(probe_points((p,)) + class_points(p))]
            planned = [(k, x) for k, p in enumerate(self.config.profiles) if self._plans_per_shape(k)
                       for x in every_point(p) if (k, x) not in searched]
        with cudnn_search():
            if not self._warm(searched):
                return
        if not self._warm(planned):
            return
        torch.cuda.synchronize()
        self.build_info["warm_up_seconds"] = round(time.perf_counter() - start, 3)
        self.build_info["warm_up_shapes"] = len(searched) + len(planned)
        note = (f"warm-up: ran every input shape of the profile ({len(searched) + len(planned)} in all) at build and "
                "at each load, as its convs run cuDNN, which plans each conv at each new shape (ms each)")
        if planned and note not in self.build_info.setdefault("notes", []):
            self.build_info["notes"].append(note)

    def _warm(self, points: list[tuple]) -> bool:
        """Run an eager context at each (profile, input shapes) on zeros; False (with a load note) when zeros are not
        valid data for the model: its first real call compiles instead."""
        net = self.network
        for profile, point in points:
            ctx = ExecutionContext(self, cuda_graph=False, profile=profile)
            feeds = {n: torch.zeros(point.get(n, net.tensors[n].shape), dtype=net.tensors[n].dtype.torch,
                                    device=self.device.torch_device) for n in net.inputs}
            try:
                ctx.run(feeds)
            except KilnError as e:
                self.build_info.setdefault("load_notes", []).append(f"warm-up at {feeds_str(point)} failed: {e}")
                return False
        return True

    def _plans_per_shape(self, profile: int) -> bool:
        """Whether a layer of `profile` runs a tactic whose library plans at each new shape (Tactic.plans_per_shape)."""
        return any(registry.get(c.tactic).plans_per_shape for c in self.profile_tactics[profile].values())

    # -- plan files -----------------------------------------------------------------------
    def serialize(self, plan_name: str = "MODEL.plan", sign_key=None) -> bytes:
        """The plan file's bytes; `sign_key` (a PEM path or Ed25519 private key) signs it."""
        manifest, tensors = network_to_json(self.network)
        config = self.config.to_json()
        manifest = {"network": manifest, "plugins": plugins_to_json(self.network), "config": config,
                    "build": self.build_info,
                    "memory": self.memory_plan.to_json(),
                    "tactics": {name: c.to_json() for name, c in self.tactics.items()}}
        if len(self.profile_tactics) > 1:  # profiles 1.. : the layers whose choice differs from profile 0's
            manifest["profile_tactics"] = [{n: c.to_json() for n, c in p.items() if c != self.tactics[n]}
                                           for p in self.profile_tactics[1:]]
        header = {"device": self.tuned_for, "source_sha256": self.source_sha256,
                  "hardware_compat": self.config.hardware_compat,
                  "rebuild": compat.rebuild_command(config, str(self.build_info.get("source") or ""), plan_name)}
        if "retune" in self.build_info:
            header["retuned_from"] = self.build_info["retune"].get("from")
        if sign_key is not None and not hasattr(sign_key, "sign"):
            sign_key = signing.load_private_key(sign_key)
        return plan.encode(header, manifest, tensors, sign_key)

    def save(self, path: str | os.PathLike, sign_key=None, *, force: bool = False) -> Path:
        """Write the plan atomically; `sign_key` (a PEM path or Ed25519 private key) signs it. An existing file
        that is not a plan is replaced only with `force`."""
        files.check(path, plan.KIND, force=force, what="plan file", error=PlanError)  # before serializing
        return plan.write(path, self.serialize(Path(path).name, sign_key), force=force)

    @classmethod
    def load(cls, path: str | os.PathLike, policy: compat.Policy | str = "strict", *, verify_key=None,
             timing_cache: str | os.PathLike | None = None, force_retune: bool = False,
             progress=None) -> "Engine":
        """Read a plan; check its signature (when `verify_key` is given) and its device under `policy`, from the
        header alone; `retune` re-runs the autotuner here when device or software differ (or `force_retune`)."""
        start = time.perf_counter()
        policy = compat.Policy.parse(policy)
        reports: list[compat.Report] = []
        p = plan.read(path, verify_key, lambda h: reports.append(compat.check(h, policy, source=str(path))))
        report = reports[0]
        device = report.device
        try:
            m = p.manifest
            for warning in check_plugins(m.get("plugins"), str(path)):  # never imports what the plan names
                warnings.warn(warning, compat.CompatibilityWarning, stacklevel=2)
            network = network_from_json(m["network"], p.tensors)
            config = BuildConfig.from_json(m["config"])
            build_info = dict(m.get("build") or {})
            tactics = _read_tactics(m.get("tactics") or {}, network, path)
            others = m.get("profile_tactics") or []
            if not isinstance(others, list) or len(others) > max(0, len(config.profiles) - 1):
                raise PlanError(f"{path}: manifest's profile_tactics is not a list of one entry per profile after "
                                f"the first ({len(config.profiles)} profiles); rebuild the plan")
            profile_tactics = [tactics] + [_read_tactics(p, network, path) for p in others]
        except PlanError:
            raise
        except Exception as e:
            raise PlanError(f"{path}: manifest is malformed ({type(e).__name__}: {printable(str(e))}); "
                            "rebuild the plan") from None
        tuned_for = report.built
        if policy is compat.Policy.RETUNE and (report.differs or force_retune):
            profile_tactics, info = retune(network, config, device, profile_tactics,
                                           str(timing_cache) if timing_cache else None, progress)
            tactics = profile_tactics[0]
            build_info["retune"] = dict(info, **{"from": report.built.get("name"), "differences": report.blocking
                                                 + report.notes})
            tuned_for = None  # this device's fingerprint
        try:
            engine = cls(network, config, device, source_sha256=str(p.header.get("source_sha256", "")),
                         build_info=build_info, header=p.header, tactics=tactics, tuned_for=tuned_for,
                         profile_tactics=profile_tactics)
        except KilnError:
            raise
        except Exception as e:
            raise PlanError(f"{path}: its layers cannot be set up as the manifest describes them "
                            f"({type(e).__name__}: {printable(str(e))}); rebuild the plan") from None
        if "retune" in build_info:
            engine.build_info["tactics"] = engine.tactic_summary()  # the build's summary named the old device's
        for step, layer in enumerate(network.layers):
            engine.kernels[step] = _checked_once(engine, step, layer, str(path))
        engine.warm_up()
        engine.build_info["load_seconds"] = time.perf_counter() - start
        return engine


def _same(a: Choice, b: Choice) -> bool:
    """Whether two choices compile to the same kernel."""
    return a is b or (a.tactic, a.config) == (b.tactic, b.config)


def _read_tactics(raw, network: Network, path) -> dict[str, Choice]:
    """A manifest's {layer: Choice} (its "tactics", or one profile's entry of "profile_tactics"), checked."""
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: manifest's tactics are not a mapping of layer name to choice; rebuild the plan")
    tactics = {str(k): Choice.from_json(v) for k, v in raw.items()}
    unknown = set(tactics) - {layer.name for layer in network.layers}
    if unknown:
        raise PlanError(f"{path}: manifest has tactics for layers it does not have "
                        f"({printable(sorted(unknown)[:3])}); rebuild the plan")
    return tactics


def _unique(points: list[dict]) -> list[dict]:
    """`points` without repeats, in order."""
    return [p for i, p in enumerate(points) if p not in points[:i]]


def feeds_str(shapes: dict) -> str:
    return ", ".join(f"{n} {'x'.join(map(str, s))}" for n, s in shapes.items())


def _checked_once(engine: Engine, step: int, layer, source: str) -> Kernel:
    """The layer's kernel, checking its first call against the manifest (then running bare): a reference that fails
    on a static engine, or an output of another dtype or shape than declared, is a PlanError, never a wrong answer."""
    kernel, net = engine.kernels[step], engine.network

    def bad(what: str) -> PlanError:
        return PlanError(f"{source}: layer {printable(layer.name)} ({layer.kind}) {what}; the plan does not describe "
                         "a network kiln can run (edited, or written by a faulty kiln): rebuild it")

    def first(args, **kw):
        try:
            outs = kernel(args, **kw)
        except KilnError:
            raise
        except Exception as e:  # compiled tactics fall back to the reference; dynamic shapes may be the input's fault
            if layer.name in engine.compiled or engine.has_dynamic_inputs:
                raise
            raise bad(f"fails ({type(e).__name__}: {printable(str(e))[:200]})") from None
        if len(outs) < len(layer.outputs) and any(layer.outputs[len(outs):]):
            raise bad(f"gives {len(outs)} outputs for {len(layer.outputs)}")
        for name, value in zip(layer.outputs, outs):
            t = net.tensors.get(name)
            if t is None or t.kind != "tensor" or not isinstance(value, torch.Tensor):
                continue
            if value.dtype not in (t.dtype.torch, t.dtype.carrier) or t.is_static and tuple(value.shape) != t.shape:
                raise bad(f"computes {printable(name)} as {str(value.dtype).removeprefix('torch.')}"
                          f"{list(value.shape)}, but the plan declares {t.type_str()}")
        engine.kernels[step] = kernel
        return outs

    return first
