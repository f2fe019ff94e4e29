"""The build pipeline: load → import → passes → precision → tune → Engine, with progress callbacks.

The Engine class lives in the runtime, a layer above: `Engine.build` (kiln.build) hands it in as `make_engine`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import onnx
import torch

from kiln.builder.autotune import tune, tune_profiles
from kiln.target.device import Device, detect
from kiln.builder.specialize import needs_specialization, observe_shapes, refine_shapes, specialize_shapes
from kiln.builder.timing_cache import TimingCache
from kiln.config import BuildConfig, bucket_notes
from kiln.errors import ConfigError, ResourceLimitError
from kiln.frontend.onnx import import_onnx, load_onnx
from kiln.frontend.onnx.limits import ModelLimits
from kiln.ir import Network
from kiln.kinds.verify import verify_network
from kiln.passes import BuildTarget, PassContext, run_passes
from kiln.passes.registry import Stage
from kiln.quant import apply_precision
from kiln.kinds.qtype import QTYPES
from kiln.quant.budget import check_quant_options, copy_network, time_engines
from kiln.quant.fp8 import check_fp8
from kiln.quant.int8 import apply_int8
from kiln.quant.int8_fp16 import int8_fp16_io
from kiln.quant.int8_stage import quantize_int8
from kiln.quant.pipeline import build_passes
from kiln.quant.scheme import QuantScales, TensorScale
from kiln.quant.qdq import absorb_qdq, has_qdq
from kiln.kinds.interpret import to_device
from kiln.tactics import triton_int8_chain, triton_int8_pair
from kiln.target.hardware_compat import HardwareCompat
from kiln.util.phases import PhaseTimes

Progress = Callable[[str, int, int], None]  # (stage, done, total)
# (network, config, device, *, source_sha256=, build_info=, tactics=, profile_tactics=) → kiln.runtime.Engine
EngineFactory = Callable[..., Any]

STAGES = ("load", "import", "optimize", "specialize", "precision", "tune", "plan")


@dataclass
class BuildContext:
    """Everything a build reads, frozen at its start, and what it reports back."""

    config: BuildConfig
    device: Device
    progress: Progress
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # per STAGES entry, its seconds (phases inside it too)
    phases: PhaseTimes = field(default_factory=PhaseTimes)  # where the time went: build_info["build_phases"]


def _unhonoured(config: BuildConfig, device: Device) -> list[str]:
    """Options this backend cannot honour, said plainly instead of silently ignored."""
    if device.backend != "cpu":
        return []
    notes = []
    if config.tf32:
        notes.append("--tf32 has no effect on the CPU backend: it computes fp32 layers in full fp32")
    if config.fp16 or config.bf16:
        notes.append("the CPU backend runs fp16/bf16 layers through its reference kernels: correct, not fast")
    if config.timing_cache:
        notes.append("--timing-cache is unused by the CPU backend: it has no kernels to tune")
    if config.workspace_bytes is not None:
        notes.append("--memory-pool workspace= has no effect on the CPU backend: its reference kernels are not tuned")
    if not config.cuda_graph:
        notes.append("--no-cuda-graph has no effect on the CPU backend: it never captures CUDA graphs")
    if config.opt_level != BuildConfig.opt_level:
        notes.append("--opt-level has no effect on the CPU backend: it has no kernels to tune")
    return notes


def check_profile_memory(proto: onnx.ModelProto, config: BuildConfig, budget: int) -> None:
    """Refuse a profile whose largest shape of some input would not fit the build device, before any work."""
    dtypes = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}
    for k, profile in enumerate(config.profiles):
        for name, shapes in profile.items():
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(dtypes[name]).itemsize if dtypes.get(name) else 1
            need = math.prod(shapes.max) * itemsize
            if need > budget:
                raise ResourceLimitError(f"profile {k}: input {name!r} at its max shape {list(shapes.max)} takes "
                                         f"{need} bytes, over the build device's {budget}; lower --max-shapes")


def memory_budget(device: Device) -> int:
    """Bytes one declared tensor may take: the build device's memory (host RAM for the CPU backend), so a
    model that cannot fit fails at build with a ResourceLimitError instead of failing to allocate later."""
    if device.backend == "cuda":
        return torch.cuda.get_device_properties(device.torch_device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def pass_target(config: BuildConfig, device: Device) -> BuildTarget:
    """What the gated passes (quant/pipeline.py) need to know of this build: whether it is quantized and, if so,
    whether the device runs the Gluon int8 1x1 conv pair and chain kernels (a Hopper GPU) and which chains the
    chain kernel takes. Asked of those kernels' tactics here, so that no pass depends on a tactic module."""
    if not (config.int8 or config.fp8):
        return BuildTarget()
    if not triton_int8_pair.fast_on(device):
        return BuildTarget(quantized=True)
    return BuildTarget(quantized=True, int8_conv_kernels=True, int8_chain_fits=triton_int8_chain.fits(device))


def opt_tensor_shapes(net: Network, config: BuildConfig, device: Device) -> dict[str, tuple] | None:
    """For a GPU build with symbolic shapes: every tensor's shape when the inputs take the first profile's opt
    shapes, so that the autotuner checks and times those layers there; None when there is nothing to observe."""
    return tensor_shapes_at(net, config, device, 0, "opt")


def tensor_shapes_at(net: Network, config: BuildConfig, device: Device, profile: int = 0, which: str = "opt",
                     seen: dict | None = None) -> dict[str, tuple] | None:
    """Every tensor's shape when the inputs take profile `profile`'s `which` ("min", "opt" or "max") shapes, for a
    GPU build with symbolic shapes; None when there is nothing to observe. `seen` memoizes by input shapes."""
    if device.backend != "cuda" or all(net.tensors[n].is_static for n in net.inputs) or not config.profiles:
        return None
    inputs = [net.tensors[n] for n in net.inputs]
    p = config.profiles[profile]
    at = {t.name: (t.shape if t.is_static else getattr(p[t.name], which)) for t in inputs
          if t.is_static or t.name in p}
    if len(at) < len(inputs) or any(getattr(t, "kind", "tensor") != "tensor" for t in inputs):
        return None
    key = tuple(sorted(at.items()))
    if seen is None or key not in seen:
        observed = observe_shapes(net, device.torch_device, at)
        if seen is None:
            return observed
        seen[key] = observed
    return seen[key]


def profile_tensor_shapes(net: Network, config: BuildConfig, device: Device) -> list[dict[str, dict | None]]:
    """Per profile (one at least), every tensor's shape at its "min", "opt" and "max" input shapes (None where
    there is nothing to observe: a CPU build, static inputs), for `tune_profiles`."""
    seen: dict = {}
    return [{which: tensor_shapes_at(net, config, device, k, which, seen) for which in ("min", "opt", "max")}
            for k in range(len(config.profiles))] or [{}]


def shape_bucket_record(config: BuildConfig) -> list[dict]:
    """build_info["shape_buckets"]: per profile the user gave, the profiles its shape buckets became (indices into
    config.profiles), the dim they cut (-1: a static profile, not split) and the inputs cut along it."""
    out: dict[int, dict] = {}
    for i, (k, dim, names) in enumerate(config.profile_buckets):
        out.setdefault(k, {"profile": k, "dim": dim, "inputs": list(names), "profiles": []})["profiles"].append(i)
    return list(out.values())


def static_input_shapes(config: BuildConfig) -> dict[str, tuple[int, ...]]:
    """Inputs whose shape is fixed in every profile: the importer specializes them."""
    if not config.profiles:
        return {}
    first = config.profiles[0]
    return {n: r.min for n, r in first.items()
            if r.is_static and all(p.get(n) == r for p in config.profiles)}


def build(model: str | os.PathLike | bytes | onnx.ModelProto, config: BuildConfig | None = None,
          progress: Progress | None = None, calib_data=None, validation_data=None,
          base_dir: str | os.PathLike | None = None, *, make_engine: EngineFactory):
    """Build an engine for the best device present (or `config.device`) from an ONNX model.

    `progress(stage, done, total)`: each of STAGES as it starts; inside "tune" on a GPU, "tune: compile + check"
    (candidates checked) and then "tune" (layers tuned).
    `base_dir`: the folder holding the external data of a model given as bytes or a ModelProto.
    `make_engine`: the Engine class (or a factory like it) the tuned network is made into.
    """
    if not isinstance(model, (str, os.PathLike, bytes, bytearray, onnx.ModelProto)):
        raise ConfigError(f"kiln.build: model must be an .onnx file path, the model's bytes or an onnx.ModelProto, "
                          f"got {type(model).__name__}")
    if not isinstance(config, (BuildConfig, type(None))):
        raise ConfigError(f"kiln.build: config must be a kiln.BuildConfig, got {type(config).__name__}; "
                          "e.g. kiln.BuildConfig(fp16=True)")
    if progress is not None and not callable(progress):
        raise ConfigError("kiln.build: progress must be a callable (stage, done, total), "
                          f"got {type(progress).__name__}")
    config = config or BuildConfig()
    t0, phases = time.perf_counter(), PhaseTimes()
    with phases.phase("device"):
        ctx = BuildContext(config, detect(config.device, config.hardware_compat), progress or (lambda *a: None),
                           phases=phases)
        ctx.notes += _unhonoured(config, ctx.device)
        ctx.notes += bucket_notes(config)
        check_quant_options(config)
        check_fp8(config, ctx.device, calib_data)
        if config.hardware_compat != "none":
            ctx.notes.append(HardwareCompat.parse(config.hardware_compat).describe())

    def stage(name: str, fn, phase: str | None = None):
        """Run stage `name`, timed as itself (ctx.timings) and as phase `phase` (default: the stage's name)."""
        ctx.progress(name, STAGES.index(name), len(STAGES))
        start = time.perf_counter()
        with phases.phase(phase or name):
            out = fn()
        ctx.timings[name] = time.perf_counter() - start
        return out

    limits = ModelLimits(fold_budget_bytes=config.fold_budget_bytes,
                         max_tensor_bytes=min(ModelLimits.max_tensor_bytes, memory_budget(ctx.device)))
    loaded = stage("load", lambda: load_onnx(model, limits, input_shapes=static_input_shapes(config),
                                             base_dir=base_dir))
    check_profile_memory(loaded.proto, config, limits.max_tensor_bytes)
    net = stage("import", lambda: import_onnx(loaded.proto))
    onnx_nodes = len(loaded.proto.graph.node)
    imported_layers = len(net.layers)
    pctx = PassContext(fold_budget_bytes=config.fold_budget_bytes, target=pass_target(config, ctx.device))
    quantize = config.int8 or config.fp8
    qdq = absorb_qdq(net) if quantize and has_qdq(net) else None
    if not quantize and has_qdq(net):
        ctx.notes.append("the model has Q/DQ nodes: they run as written, in float; add --int8 to run its "
                         "quantized layers as int8")
    net = stage("optimize", lambda: run_passes(net, build_passes(pctx.target, Stage.OPTIMIZE), pctx))
    if needs_specialization(net):
        learned = stage("specialize", lambda: specialize_shapes(net, ctx.device.torch_device))
        if learned:
            ctx.notes.append(f"shapes: {learned} tensors' shapes learned from one run with the fixed input shapes")
            with phases.phase("optimize"):
                run_passes(net, build_passes(pctx.target, Stage.OPTIMIZE), pctx)
    else:
        refined = stage("specialize", lambda: refine_shapes(net, config.profiles, ctx.device.torch_device))
        if refined:
            ctx.notes.append(f"shapes: {refined} tensors' shapes refined from runs across the profiles' range")
            with phases.phase("optimize"):
                run_passes(net, build_passes(pctx.target, Stage.OPTIMIZE), pctx)
    int8_info: dict = {}  # the int8 or fp8 rewrite's record (its "qtype" says which)
    before_int8: list[Network] = []  # the float network, kept to time the all-int8 engine a budget deviates from

    def precision() -> list[str]:
        notes = []
        if quantize:  # layers left float run in fp16 on the GPU, as TensorRT's --int8 --fp16
            if config.accuracy and ctx.device.backend == "cuda":
                before_int8.append(copy_network(net))
            notes, record = quantize_int8(net, config, ctx.device, qdq, calib_data, validation_data=validation_data,
                                          phases=phases)
            int8_info.update(record)
        cuda_int8 = quantize and ctx.device.backend == "cuda" and not config.bf16
        notes += apply_precision(net, replace(config, fp16=True) if cuda_int8 else config)
        notes += int8_fp16_io(net) if quantize and (cuda_int8 or config.fp16) else []
        run_passes(net, build_passes(pctx.target, Stage.PRECISION), pctx)
        folded, paired, chained = (pctx.log.get(f"{p}.layers", 0) for p in ("fold_quantize", "fuse_conv_pair",
                                                                           "fuse_conv_chain"))
        return notes + ([f"{folded} QuantizeLinear layers folded into the add+LayerNorm or attention before them"]
                        if folded else []) + ([f"{paired} int8 1x1 convs fused with the 1x1 conv that adds them (a "
                                     "bottleneck's last conv and its downsample)"] if paired else []) + \
            ([f"{chained} int8 1x1 convs fused with the 1x1 conv that reads them (a bottleneck's last conv and the "
              "next block's first)"] if chained else [])

    ctx.notes += stage("precision", precision)
    with phases.phase("verify"):
        verify_network(net)
    info = {"source": loaded.source, "onnx_nodes": onnx_nodes, "imported_layers": imported_layers,
            "layers": len(net.layers), "passes": pctx.log, "notes": ctx.notes}
    if int8_info:
        info["int8"] = int8_info
    if config.profile_buckets:
        info["shape_buckets"] = shape_bucket_record(config)
    phases.count("layers", len(net.layers))

    def tune_stage():  # "tune: other": device weights, timing cache, observed shapes, the autotuner's bookkeeping
        weights = {k: to_device(v, ctx.device.torch_device) for k, v in net.constants.items()}
        cache = TimingCache(config.timing_cache) if config.timing_cache and ctx.device.backend == "cuda" else None
        shapes = profile_tensor_shapes(net, config, ctx.device)
        return cache, tune_profiles(net, weights, ctx.device, config.opt_level, config.tf32, cache, ctx.progress,
                                    config.workspace_bytes, shapes, phases)

    cache, choices = stage("tune", tune_stage, "tune: other")
    if cache is not None:
        info["timing_cache"] = {"path": str(cache.path), "hits": cache.hits, "misses": cache.misses}
    engine = stage("plan", lambda: make_engine(net, config, ctx.device, source_sha256=loaded.sha256,
                                               build_info=info, tactics=choices[0], profile_tactics=choices),
                   "engine: other")
    for part, seconds in getattr(engine, "setup_seconds", {}).items():  # measured inside the Engine
        phases.split("engine: other", f"engine: {part}", seconds)
    engine.build_info["tactics"] = engine.tactic_summary()
    if "budget" in int8_info:
        with phases.phase("accuracy budget"):
            int8_info["budget"]["cost"] = _fallback_cost(engine, before_int8, int8_info, cache, make_engine)
    engine.build_info["stage_seconds"] = ctx.timings
    engine.build_info["build_seconds"] = time.perf_counter() - t0
    recorded = phases.to_json()  # "busy": compile + check per tactic, thread-seconds
    engine.build_info |= {"build_phases": recorded["seconds"], "build_counts": recorded["counts"],
                          "build_check_seconds": recorded["busy"]}
    ctx.progress("done", len(STAGES), len(STAGES))
    return engine


def _fallback_cost(engine, before: list[Network], record: dict, cache, make_engine: EngineFactory) -> dict:
    """What the accuracy budget's float layers cost: the chosen engine vs the all-int8 one, timed (CUDA only)."""
    budget = record["budget"]
    if not budget["fallbacks"]:
        return {"note": "no layer fell back: nothing to time"}
    if not before:
        return {"note": "not timed: the CPU backend runs reference kernels, so its times say nothing of the GPU's"}
    if any(v.get("source") == "Q/DQ" for v in record["tensors"].values()):
        return {"note": "not timed for models with their own Q/DQ nodes"}
    net, config = before[0], engine.config
    scales = QuantScales({n: TensorScale(v["scale"], v["source"]) for n, v in record["tensors"].items()})
    pinned = {n for n, r in record["layers"].items() if r["precision"] == "float" and n not in budget["fallbacks"]}
    apply_int8(net, scales, pinned, QTYPES[record.get("qtype", "int8")])
    apply_precision(net, replace(config, fp16=not config.bf16))
    if not config.bf16:
        int8_fp16_io(net)
    target = pass_target(config, engine.device)
    run_passes(net, build_passes(target, Stage.PRECISION), PassContext(target=target))
    weights = {k: to_device(v, engine.device.torch_device) for k, v in net.constants.items()}
    choices = tune(net, weights, engine.device, config.opt_level, config.tf32, cache, lambda *a: None,
                   config.workspace_bytes)
    all_int8 = make_engine(net, config, engine.device, tactics=choices)
    return time_engines({"chosen": engine, "all_int8": all_int8})
