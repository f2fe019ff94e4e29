"""The autotuner: for each layer, time every candidate tactic on the device, keep the fastest correct one.

A candidate must reproduce the layer's reference output (tolerance by precision) before it can win;
one that fails to compile, runs out of resources or gives a wrong result is recorded with its reason
and never aborts the build. Opt level 0 takes the highest-priority candidate that passes the check.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch

from kiln.builder.timing_cache import CachedChoice, TimingCache, environment_key
from kiln.ir import DType, Network
from kiln.kinds import qtype as qtypes, quantized
from kiln.tactics import registry
from kiln.tactics.choice import Choice
from kiln.tactics.common import cudnn_search
from kiln.tactics.spec import LayerSpec, layer_spec
from kiln.util.phases import PhaseTimes
from kiln.util.timing import device_time_us

REPEATS = {0: 0, 1: 5, 2: 10, 3: 20, 4: 30, 5: 50}
CONFIGS_PER_TACTIC = {0: 1, 1: 1, 2: 2, 3: 8, 4: 32, 5: 1000}
PREFETCH = "tune: compile + check"  # the progress stage of Autotuner.prefetch
CUTOFF = 3.0  # a candidate whose one warm-up run took over 3x the best time so far is timed no further
# ... and over this many µs: one warm-up run's time carries launch jitter of tens of µs (gVisor hosts), so against a
# 5 µs best the cutoff threw out every Triton conv of MobileNetV2 at batch 1 in some builds; timing a candidate of
# under 0.2 ms in full costs a few ms
CUTOFF_FLOOR_US = 200.0
TOLERANCE = {torch.float32: (1e-3, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}
# Quantized layers (int32 accumulation is exact in every tactic): a requantized int8 output may differ by
# 1 LSB (an fp32 epilogue value one ulp apart lands on the other side of a .5); a dequantized fp32 output
# by fp32 rounding (FMA contraction, activation approximations): rtol 1e-4 plus 1e-5 of the output's range.
QUANTIZED = quantized.KINDS
# integer inputs that are keep masks (passes/attention_keep_mask.py): any values are valid, so random ones time it
KEEP_MASKS = {"FusedAttention": 3}
QUANT_INT8_LSB = 1
FP16_ULP = 2.0 ** -10
# fp8 layers (qtype fp8e4m3) sum exact products in fp32, or narrower inside the MMA unit between promotions, in
# any order: an fp32/fp16 output within 2e-3 relative plus 1e-3 of the output's range (many times the expected
# error, far below an fp8 step of 1/16); an fp8 output within one e4m3 step (1/8 of the value, 2⁻⁹ near zero).
FP8_FLOAT_TOL = (2e-3, 1e-3)
FP8_STEP = (2.0 ** -3, 2.0 ** -9)
# fp8 tensor cores sum partial products in less than fp32 before promoting them (Hopper), so a result may be off
# by a small fraction of the sum of its terms' magnitudes, however small the result: 2⁻⁹ of Σ|terms| is allowed
FP8_ACCUMULATION = 2.0 ** -9


def _random_input(v, device) -> Any:
    if v is None:
        return None
    if v.const is not None:
        return v.const
    if v.dtype is DType.INT8:  # quantized activations: spread over the whole int8 range, as calibrated ones are
        return torch.randint(-127, 128, v.shape, device=device, dtype=torch.int8)
    if v.dtype is DType.FP8E4M3:  # the same for fp8: most of the e4m3 range, a few values saturated at ±448
        return (torch.randn(v.shape, device=device) * 128).clamp(-448, 448).to(torch.float8_e4m3fn)
    if v.dtype is DType.BOOL:  # masks: mostly True, so rows with nothing attended stay rare
        return torch.rand(v.shape, device=device) < 0.9
    if v.dtype in (DType.INT64, DType.INT32):  # indices: -1 (the last, wrapped) and 0 fit every non-empty axis,
        # where ±2 could miss a two-row table (BERT's segments) and a CUDA index_select asserts on the device
        return torch.randint(-1, 1, v.shape, device=device, dtype=v.dtype.torch)
    return (torch.randn(v.shape, device=device) * 0.5).to(v.dtype.torch)


def _head_split(x: torch.Tensor, kt: bool = False) -> torch.Tensor:
    """4-D (B, H, S, D) x — (B, H, D, S) for Kᵀ — with the same values, laid out as the view of a (B, S, H, D)
    projection output that exported attention reads (its head split)."""
    if kt:
        return x.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _in_layout(inputs: list, spec: LayerSpec, config: dict) -> list:
    """Activations as the engine will hand them over: an NHWC layer is timed on channels_last inputs (the steady
    state when the layers around it are NHWC too), 4-D attention on Q, Kᵀ and V as head-split views (a
    kernel's best tile depends on which dim is contiguous)."""
    if spec.kind == "FusedAttention" and all(isinstance(x, torch.Tensor) and x.dim() == 4 for x in inputs[:3]):
        return [_head_split(inputs[0]), _head_split(inputs[1], kt=True), _head_split(inputs[2]), *inputs[3:]]
    if config.get("layout") != "nhwc":
        return inputs
    return [x.contiguous(memory_format=torch.channels_last)
            if isinstance(x, torch.Tensor) and x.dim() == 4 and (v is None or v.const is None) else x
            for x, v in zip(inputs, spec.inputs)]


def _short_of_memory(device) -> bool:
    """Under 40 % of the GPU's memory free: prefetch checks no more layers ahead of their timing."""
    if device.backend != "cuda":
        return False
    free, total = torch.cuda.mem_get_info(device.torch_device)
    return free < 0.4 * total


def used_outputs(spec: LayerSpec, outs: list) -> list:
    """The reference's outputs with None where the layer's output is absent (no reader, as AddLayerNorm's sum
    when only the normalized rows are read): a tactic need not compute those, so they are not compared."""
    return [o if i < len(spec.outputs) and spec.outputs[i] is not None and spec.outputs[i].dtype is not None
            else None for i, o in enumerate(outs)]


def fp8_slack(spec: LayerSpec, inputs: list) -> torch.Tensor:
    """Per output of an fp8 quantized layer, the accumulation error its GPU kernels may show, in output units:
    FP8_ACCUMULATION × the reference on the inputs' magnitudes (no activation, no requantize) ÷ out_scale."""
    attrs = spec.attrs | {"activation": "none", "activation_params": [], "out_scale": None}
    magnitudes = [x.float().abs().to(x.dtype) if isinstance(x, torch.Tensor) else x for x in inputs]
    terms = registry.reference_kernel(LayerSpec(spec.name, spec.kind, attrs, spec.inputs, spec.outputs))(magnitudes)
    return FP8_ACCUMULATION * terms[0].float() / (spec.attrs.get("out_scale") or 1.0)


def _float_lsb(spec: LayerSpec) -> int:
    """int8 steps a quantized attention output may differ by beyond one: its float result is within its dtype's
    tolerance of the reference's (fp16: 1 %, up to 1.3 steps at a scale of amax / 127), not bit-exact."""
    if spec.kind != "FusedAttention" or spec.attrs.get("q_scale") is None:
        return 0
    return math.ceil(127 * TOLERANCE.get(spec.inputs[0].dtype.torch, (0, 0))[0])


def _close(got: list, want: list, tf32: bool, quantized: bool = False, fp8: bool = False,
           slack: torch.Tensor | None = None, requantized: bool = False, extra_lsb: int = 0) -> str | None:
    """None if `got` matches `want` output by output, else what differs (`fp8`: a quantized layer of qtype fp8,
    `slack` its first output's allowance for accumulation error, from `fp8_slack`; `requantized`: the layer's
    int8 / fp8 outputs quantize a float result of its own, so they may sit one step apart, `extra_lsb` more
    steps where that float result itself may differ by its dtype's tolerance)."""
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {getattr(g, 'dtype', type(g))}{list(getattr(g, 'shape', []))} " \
                   f"instead of {w.dtype}{list(w.shape)}"
        rtol, atol = TOLERANCE.get(w.dtype, (0, 0))
        if tf32 and w.dtype == torch.float32:
            rtol, atol = 1e-2, 1e-2
        if quantized or requantized and w.dtype in (torch.int8, torch.float8_e4m3fn):
            amax = w.float().abs().max().item() if w.numel() else 0.0
            rtol = FP16_ULP if w.dtype == torch.float16 else 1e-4  # fp16 out: one rounding, 1 ulp apart at most
            rtol, atol = (0, QUANT_INT8_LSB + extra_lsb) if w.dtype == torch.int8 else (rtol, 1e-5 * amax + 1e-6)
            if fp8 or w.dtype == torch.float8_e4m3fn:
                rtol, atol = FP8_STEP if w.dtype == torch.float8_e4m3fn else \
                    (FP8_FLOAT_TOL[0], FP8_FLOAT_TOL[1] * amax + 1e-6)
        if slack is not None and i == 0:
            atol = atol + slack
        if not _within(g.float(), w.float(), rtol, atol):
            err = (g.float() - w.float()).abs().max().item()
            return f"wrong result: output {i} differs by up to {err:.3g} (rtol {rtol}, atol {atol})"
    return None


def _within(g: torch.Tensor, w: torch.Tensor, rtol: float, atol: float) -> bool:
    """|g - w| ≤ atol + rtol·max(|g|, |w|) everywhere (NaN where both are NaN). Symmetric, so that one rounding
    step of the larger value passes where the two straddle a binade boundary (fp8 112 vs 128: a step of 16)."""
    ok = (g == w) | (g.isnan() & w.isnan()) | ((g - w).abs() <= atol + rtol * torch.maximum(g.abs(), w.abs()))
    return bool(ok.all())


def workspace_bytes(kernel, inputs) -> int:
    """Transient device memory one run of `kernel` takes beyond its outputs: the allocator's peak during the
    run, less what was allocated before it and what its outputs keep (each rounded to the allocator's 512 B)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    outs = kernel(inputs)
    torch.cuda.synchronize()
    kept = sum(-(-o.untyped_storage().nbytes() // 512) * 512
               for o in outs if isinstance(o, torch.Tensor) and o.is_cuda)
    return max(0, torch.cuda.max_memory_allocated() - before - kept)


def env_compile_threads(backend: str) -> int:
    """KILN_COMPILE_THREADS: how many candidates of a layer are compiled and checked at once. Default on a GPU: 8
    (at most the CPUs this process may use), as Triton's compiles overlap (cold H100 builds 1.6-2.5x faster);
    elsewhere 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    default = min(8, cpus) if backend == "cuda" else 1
    value = os.environ.get("KILN_COMPILE_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else default


class Autotuner:
    """Chooses a tactic per layer for one build; reads and fills the timing cache."""

    def __init__(self, device, opt_level: int, tf32: bool, cache: TimingCache | None,
                 workspace: int | None = None, phases: PhaseTimes | None = None, compile_threads: int | None = None):
        self.device, self.level, self.tf32, self.cache, self.workspace = device, opt_level, tf32, cache, workspace
        self.compile_threads = env_compile_threads(device.backend) if compile_threads is None else compile_threads
        # where tuning time goes: "tune: reference" (random inputs, reference outputs), "tune: compile + check"
        # (each candidate's compile, first call — Triton JIT, cuDNN plan — and comparison), "tune: timing"
        self.phases = phases if phases is not None else PhaseTimes()
        if self.compile_threads > 1 and opt_level > 0 and workspace is None:  # under `kiln build`'s time table
            self.phases.counts["compile threads"] = self.compile_threads
        self.env = environment_key(dict(device.fingerprint(), hardware_compat=device.hardware_compat))
        if workspace is not None:  # a choice made under a workspace limit is not the unlimited one
            self.env += f"|workspace<={workspace}"
        self.by_layout: dict[str, dict[str, tuple[float, str, dict]]] = {}  # layer → layout → best timing
        # this build's measured choices by layer signature, with the layer's timings per layout: a layer identical
        # to one already tuned (BERT's 12 encoder layers, a ResNet stage's blocks) is not tuned again, cache or not
        self.tuned: dict[str, tuple[Choice, dict[str, tuple[float, str, dict]]]] = {}
        self.prefetched: dict[str, tuple] = {}  # signature → (reference, checked candidates): see prefetch
        # the same by shape signature (float attributes left out): a layer that differs only in its int8 scales
        # takes that choice too once its tactic (and each layout's best) passes the check at its own scales
        self.alike: dict[str, tuple[Choice, dict[str, tuple[float, str, dict]]]] = {}
        self.layout: str | None = None

    def choose_layout(self, choices: dict[str, Choice], only: set[str] | None = None) -> None:
        """One memory layout for every layer that can run either: the one with the lower summed time, so
        activations are not reformatted between neighbours (each NHWC layer was timed on NHWC inputs). `only`:
        re-decide just these layers (another profile's symbolic ones), in the layout chosen before if any."""
        both = {n: t for n, t in self.by_layout.items() if {"nchw", "nhwc"} <= set(t) and (only is None or n in only)}
        if not both:
            return
        if only is None or self.layout is None:
            self.layout = min(("nchw", "nhwc"), key=lambda lay: sum(t[lay][0] for t in both.values()))
        for name, timings in both.items():
            us, tactic, config = timings[self.layout]
            choices[name] = Choice(tactic, config, us, "timed", choices[name].rejected, choices[name].timed)

    def choose(self, spec: LayerSpec, tuning: LayerSpec | None = None,
               checks: list[tuple[str, LayerSpec | None]] = ()) -> Choice:
        """The tactic for `spec`. A layer with symbolic shapes is checked and timed on `tuning`, the same layer
        at the profile's opt shapes, among the tactics that take its symbolic shapes (TensorRT tunes at opt), and
        checked, not timed, on each of `checks` ((what, the layer at the profile's min or max shapes))."""
        plan = self._plan(spec, tuning, checks)
        if isinstance(plan, Choice):
            return plan
        cands, refused, timed_spec, probes, sig, alike = plan
        if sig in self.tuned and self.level > 0:
            choice, layouts = self.tuned[sig]
            self.phases.count("identical layers reused")
            if layouts:
                self.by_layout[spec.name] = dict(layouts)
            return replace(choice)
        if self.cache is not None and self.level > 0:
            hit = self.cache.get(self.env, sig)
            if hit is not None and hit.tactic in {t.name for t in cands}:
                self.phases.count("timing cache hits")
                return Choice(hit.tactic, hit.config, hit.microseconds, "cache", refused)
            self.phases.count("timing cache misses")
        choice = self._recheck(spec.name, timed_spec, cands, probes, *self.alike[alike]) \
            if alike in self.alike and self.level > 0 else None
        if choice is None:
            self.phases.count("layers tuned")
            choice = self._measure(timed_spec, cands, refused, probes, self.prefetched.pop(sig, None))
        if self.level > 0:
            self.tuned[sig] = (choice, dict(self.by_layout.get(spec.name, {})))
            self.alike.setdefault(alike, self.tuned[sig])
            if self.cache is not None:
                self.cache.put(self.env, sig, CachedChoice(choice.tactic, choice.config, choice.microseconds))
        return choice

    def _plan(self, spec: LayerSpec, tuning: LayerSpec | None, checks) -> Choice | tuple:
        """A Choice made without measuring (no candidate but the reference, a view, nothing to time with), else
        (candidates, refused, the spec to time, [(what, spec to check too)], signature, shape signature)."""
        cands, refused = registry.candidates(spec, self.device)
        left_out = registry.untried(cands, self.level, spec)
        cands = [t for t in cands if t not in {t for t, _ in left_out}]
        refused = refused + [(t.name, why) for t, why in left_out]
        fast = [t for t in cands if t.name != registry.REFERENCE]
        if not fast:
            return Choice(registry.REFERENCE, rejected=refused)
        if fast[0].untimed:  # a view: nothing to time, and always at least as fast as the reference
            return Choice(fast[0].name, {}, None, "heuristic", refused)
        timed_spec = spec if spec.static else tuning
        if timed_spec is None or not timed_spec.static or any(
                v is not None and v.const is None and not v.dtype.is_float and v.dtype is not DType.BOOL
                and not (v.dtype is DType.INT8 and spec.kind in QUANTIZED) and KEEP_MASKS.get(spec.kind) != i
                for i, v in enumerate(spec.inputs) if v is not None and v.dtype is not None):
            t = fast[0]  # no representative data to time or check with: priority decides
            return Choice(t.name, t.configs(spec, self.device, self.level)[0], None, "heuristic", refused)
        probes = [] if spec is timed_spec else [
            (what, c) for what, c in checks if c is not None and c.static and c.signature() != timed_spec.signature()]
        sig = spec.signature() if spec is timed_spec else f"{spec.signature()}@{timed_spec.signature()}"
        sig += "".join(f"|{c.signature()}" for _, c in probes)  # checked there too: another range, another answer
        alike = "|".join([spec.shape_signature(), timed_spec.shape_signature()]
                         + [c.shape_signature() for _, c in probes])
        return cands, refused, timed_spec, probes, sig, alike

    def _recheck(self, name: str, spec: LayerSpec, cands, probes: list, choice: Choice,
                 layouts: dict[str, tuple[float, str, dict]]) -> Choice | None:
        """`choice` (with its per-layout timings) for layer `name` if its tactic and each layout's best pass the
        check at `spec`, the layer at the shapes it was tuned at; None (tune it in full) if one does not."""
        tactics = {t.name: t for t in cands}
        todo = {(choice.tactic, repr(choice.config)): (choice.tactic, choice.config)}
        todo |= {(n, repr(c)): (n, c) for _, n, c in layouts.values()}
        if any(n not in tactics for n, _ in todo.values()):
            return None
        with torch.no_grad():
            with self.phases.phase("tune: reference"):
                reference = self._reference(spec)
                others = [(what, probe, self._reference(probe)) for what, probe in probes]
            for *_, why in self._checked([(tactics[n], c) for n, c in todo.values()], spec, reference, others):
                self.phases.count("candidates compiled")
                if why:
                    self.phases.count("candidates rejected")
                    return None
        self.phases.count("same-shape layers reused (checked)")
        if layouts:
            self.by_layout[name] = dict(layouts)
        return replace(choice)

    def prefetch(self, specs: list[LayerSpec], progress: Callable[[str, int, int], None] = lambda *a: None) -> None:
        """Compile and check the candidates of every static layer this build will tune before any is timed: the
        compiles of all layers share the thread pool (no layer waits on its slowest compile while threads idle)
        and the checks of tactics that plan per shape (cuDNN) run on this thread meanwhile. Timing stays one layer
        at a time on a quiet GPU (choose). One layer per shape signature: choose reuses it for the others.
        `progress` hears ("tune: compile + check", candidates checked, candidates) on this thread."""
        if not self._pooled(2):
            return
        jobs, seen = [], set()
        for spec in specs:
            plan = self._plan(spec, None, ())
            if isinstance(plan, Choice):
                continue
            cands, _, timed_spec, _, sig, alike = plan
            cached = self.cache is not None and self.cache.get(self.env, sig) is not None
            if timed_spec is not spec or alike in seen or sig in self.tuned or alike in self.alike or cached:
                continue
            if _short_of_memory(self.device):  # the rest are checked when tuned, as without prefetching
                break
            seen.add(alike)
            with torch.no_grad(), self.phases.phase("tune: reference"):
                reference = self._reference(spec)
            jobs.append((sig, self._todo(spec, cands), spec, reference, []))
        with torch.no_grad():
            done = self._check_all([job[1:] for job in jobs], lambda n, total: progress(PREFETCH, n, total))
        for (sig, _, _, reference, _), results in zip(jobs, done):
            self.prefetched[sig] = (reference, results)

    def _pooled(self, n: int) -> bool:
        """Whether `n` candidate checks go to the thread pool (opt level ≥ 1, no workspace limit, threads > 1)."""
        return self.compile_threads > 1 and self.level > 0 and self.workspace is None and n > 1

    def _todo(self, spec: LayerSpec, cands) -> list[tuple]:
        """(tactic, config) of every candidate config to check at `spec`."""
        return [(tactic, config) for tactic in cands
                for config in tactic.configs(spec, self.device, self.level)[:CONFIGS_PER_TACTIC[self.level]]]

    def _one(self, item: tuple, spec: LayerSpec, reference: tuple, others: list) -> tuple:
        """(tactic, config, kernel, why not) of `item` compiled, run and compared at `spec`, then at each of
        `others` (the profile's min/max shapes)."""
        tactic, config = item
        start = time.perf_counter()
        kernel, why = self._check(tactic, config, spec, reference)
        for what, probe, ref in others if not why else ():
            why = self._check(tactic, config, probe, ref)[1]
            if why:
                why = f"fails at {what}: {why}"[:300]
                break
        self.phases.tally(tactic.name, time.perf_counter() - start)  # which tactics the compile + check costs
        return tactic, config, kernel, why

    def _checked(self, todo: list, spec: LayerSpec, reference: tuple, others: list) -> Iterator[tuple]:
        """_one of each (tactic, config) of `todo`, in order: all at once on the thread pool when pooled (see
        _check_all), else one at a time (opt level 0 stops at the first that passes)."""
        if self._pooled(len(todo)):
            yield from self._check_all([(todo, spec, reference, others)])[0]
            return
        for item in todo:
            with self.phases.phase("tune: compile + check"):
                result = self._one(item, spec, reference, others)
            yield result

    def _check_all(self, jobs: list[tuple], tick: Callable[[int, int], None] = lambda n, total: None) \
            -> list[list[tuple]]:
        """Per job (todo, spec, reference, others), _one of each of its items, in order. Tactics that do not plan
        per shape run on a thread pool, so Triton's compiles overlap; the others meanwhile on this thread. `tick`
        hears (items done, items) on this thread as they finish."""
        if not jobs:
            return []
        stream = torch.cuda.current_stream() if self.device.backend == "cuda" else None

        def on_stream(*item):  # a thread's stream (and with it its device) and grad mode are its own
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(), torch.no_grad():
                return self._one(*item)

        # cuDNN's plans are cached per thread in torch: a tactic that plans per shape is checked here, on the
        # thread that times and runs it, or its timing would plan (and benchmark) every candidate again
        items = [(j, i, (item, spec, ref, others)) for j, (todo, spec, ref, others) in enumerate(jobs)
                 for i, item in enumerate(todo)]
        with self.phases.phase("tune: compile + check"), \
                ThreadPoolExecutor(min(self.compile_threads, len(items))) as pool:
            pooled = {(j, i): pool.submit(on_stream, *args) for j, i, args in items if not args[0][0].plans_per_shape}
            here, shown = {}, 0

            def report(n: int) -> None:  # never backwards: futures done while this thread checked count early
                nonlocal shown
                shown = max(shown, n)
                tick(shown, len(items))

            for j, i, args in items:
                if (j, i) not in pooled:
                    here[j, i] = self._one(*args)
                    report(len(here) + sum(f.done() for f in pooled.values()))
            for n, _ in enumerate(as_completed(pooled.values()), len(here) + 1):
                report(n)
            return [[pooled[j, i].result() if (j, i) in pooled else here[j, i] for i in range(len(todo))]
                    for j, (todo, *_) in enumerate(jobs)]

    def _reference(self, spec: LayerSpec) -> tuple[list, list, bool, torch.Tensor | None]:
        """(random inputs, the reference's outputs on them, whether the layer is fp8, its fp8 slack) for `spec`."""
        inputs = [_random_input(v, self.device.torch_device) for v in spec.inputs]
        want = used_outputs(spec, registry.reference_kernel(spec)(inputs))
        fp8 = spec.kind in QUANTIZED and qtypes.of(spec.attrs) is qtypes.FP8
        return inputs, want, fp8, fp8_slack(spec, inputs) if fp8 else None

    def _check(self, tactic, config: dict, spec: LayerSpec, reference: tuple) -> tuple[Any, str | None]:
        """(kernel, None or why it fails): `tactic` with `config` compiled for `spec` and compared with the
        reference's outputs (within the workspace limit, if any)."""
        inputs, want, fp8, slack = reference
        args, kernel = _in_layout(inputs, spec, config), None
        try:
            kernel = tactic.compile(spec, config, self.device)
            why = _close(kernel(args), want, self.tf32, spec.kind in QUANTIZED, fp8, slack,
                         spec.attrs.get("q_scale") is not None, _float_lsb(spec))
            if not why and self.workspace is not None:
                need = workspace_bytes(kernel, args)
                if need > self.workspace:
                    why = (f"needs {need} bytes of workspace, over the limit of {self.workspace} "
                           "(--memory-pool workspace=)")
        except torch.cuda.OutOfMemoryError:
            why = "out of memory"
        except Exception as e:  # a candidate's failure is data, never fatal
            why = f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        return kernel, why

    def _measure(self, spec: LayerSpec, cands, refused, probes: list[tuple[str, LayerSpec]] = (),
                 ready: tuple | None = None) -> Choice:
        """Check every candidate config at `spec` (and at each of `probes`), time those that pass at `spec`.
        `ready`: (reference, checked candidates) from prefetch."""
        with torch.no_grad():
            if ready is not None:
                reference, checked = ready
            else:
                with self.phases.phase("tune: reference"):
                    reference = self._reference(spec)
                    others = [(what, probe, self._reference(probe)) for what, probe in probes]
                checked = self._checked(self._todo(spec, cands), spec, reference, others)
            rejected, timed = list(refused), []
            for tactic, config, kernel, why in checked:
                label = f"{tactic.name}{config or ''}"
                self.phases.count("candidates compiled")  # and checked, at the profiles' min/max shapes too
                if why:
                    self.phases.count("candidates rejected")
                    rejected.append((label, why))
                    continue
                if self.level == 0:
                    return Choice(tactic.name, config, None, "heuristic", rejected)
                self.phases.count("candidates timed")
                best = min((t[0] for t in timed), default=None)
                with self.phases.phase("tune: timing"):  # one far slower than the best so far is not timed in full
                    us = device_time_us(kernel, _in_layout(reference[0], spec, config), REPEATS[self.level],
                                        cutoff_us=None if best is None else max(CUTOFF * best, CUTOFF_FLOOR_US))
                timed.append((us, tactic.name, config, label))
        if not timed:
            return Choice(registry.REFERENCE, {}, None, "fallback", rejected)
        for us, name, config, _ in timed:
            if "layout" in config:
                best = self.by_layout.setdefault(spec.name, {}).get(config["layout"])
                if best is None or us < best[0]:
                    self.by_layout[spec.name][config["layout"]] = (us, name, config)
        timed.sort(key=lambda t: t[0])
        us, name, config, _ = timed[0]
        return Choice(name, config, us, "timed", rejected, [(label, t) for t, _, _, label in timed])


def at_shapes(spec: LayerSpec, layer, shapes: dict[str, tuple] | None) -> LayerSpec | None:
    """`spec` with its symbolic shapes replaced by those `shapes` observed for the layer's tensors (None when one
    is missing): the layer as it runs at the profile's opt shapes."""
    if not shapes:
        return None

    def concrete(v, name):
        if v is None or v.static or v.dtype is None:
            return v
        return replace(v, shape=shapes[name]) if name in shapes else None

    ins = [concrete(v, n) for v, n in zip(spec.inputs, layer.inputs)]
    outs = [concrete(v, n) for v, n in zip(spec.outputs, layer.outputs)]
    if any(c is None and v is not None for c, v in zip(ins + outs, list(spec.inputs) + list(spec.outputs))):
        return None
    return replace(spec, inputs=tuple(ins), outputs=tuple(outs), _sig=[])


def _shapes_label(layer, spec: LayerSpec | None) -> str:
    """The layer's activation inputs at `spec`'s shapes, e.g. "x 16x40, mask 16x40"."""
    if spec is None:
        return ""
    return ", ".join(f"{n} {'x'.join(map(str, v.shape))}" for n, v in zip(layer.inputs, spec.inputs)
                     if v is not None and v.const is None and v.shape is not None)


def tune(net: Network, weights: dict[str, torch.Tensor], device, opt_level: int, tf32: bool,
         cache: TimingCache | None, progress: Callable[[str, int, int], None],
         workspace: int | None = None, tuning_shapes: dict[str, tuple] | None = None,
         phases: PhaseTimes | None = None) -> dict[str, Choice]:
    """A Choice for every layer of `net` (the reference everywhere on the CPU); layers with symbolic shapes are
    timed at `tuning_shapes` (every tensor's shape at the profile's opt input shapes) where given."""
    return tune_profiles(net, weights, device, opt_level, tf32, cache, progress, workspace,
                         [{"opt": tuning_shapes}], phases)[0]


@cudnn_search()
def tune_profiles(net: Network, weights: dict[str, torch.Tensor], device, opt_level: int, tf32: bool,
                  cache: TimingCache | None, progress: Callable[[str, int, int], None], workspace: int | None = None,
                  profile_shapes: list[dict[str, dict[str, tuple] | None]] = (),
                  phases: PhaseTimes | None = None) -> list[dict[str, Choice]]:
    """A {layer: Choice} per profile (one at least). `profile_shapes`: per profile, every tensor's shape at its
    "min", "opt" and "max" input shapes. Static layers are tuned once, the same Choice in every profile; symbolic
    ones per profile, timed at its opt shapes and checked at its min and max shapes too. `phases`: where the
    tuning time goes (see Autotuner) and how many layers and candidates it tuned, compiled, timed or found cached."""
    profiles = list(profile_shapes) or [{}]
    if device.backend != "cuda":
        return [{layer.name: Choice(registry.REFERENCE) for layer in net.layers} for _ in profiles]
    tuner = Autotuner(device, opt_level, tf32, cache, workspace, phases)
    specs = [layer_spec(net, layer, weights, tf32) for layer in net.layers]
    symbolic = {layer.name for layer, spec in zip(net.layers, specs) if not spec.static}
    total, out = len(net.layers) * len(profiles), []
    started = time.perf_counter()
    tuner.prefetch([spec for spec in specs if spec.static], progress)
    for k, shapes in enumerate(profiles):
        choices = {}
        for name in symbolic:  # layout timings are per profile for symbolic layers
            tuner.by_layout.pop(name, None)
        for i, (layer, spec) in enumerate(zip(net.layers, specs)):
            progress("tune", k * len(net.layers) + i, total)
            if spec.static and out:
                choices[layer.name] = out[0][layer.name]
                continue
            if spec.static:
                choices[layer.name] = tuner.choose(spec)
                continue
            at = {which: at_shapes(spec, layer, shapes.get(which)) for which in ("opt", "min", "max")}
            checks = [(f"profile {k} {which} shapes ({_shapes_label(layer, at[which])})", at[which])
                      for which in ("min", "max")]
            choices[layer.name] = tuner.choose(spec, at["opt"], checks)
        tuner.choose_layout(choices, None if k == 0 else symbolic)
        out.append(choices)
    progress("tune", total, total)
    tuner.seconds = time.perf_counter() - started
    return out
