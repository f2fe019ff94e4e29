"""Probe: shape buckets (`kiln.BuildConfig(shape_buckets=N)`): one dynamic fp16 engine whose profile is split along
the batch into up to N profiles, each tuned at its own opt, against an engine built for exactly each measured batch;
and where each build's time goes (`engine.build_info["build_phases"]` / `["build_counts"]`).

ResNet-50 (benchmarks.models' export, dynamic batch; profile batch 1 / 32 / 64 as benchmarks.dynamic) and MiniLM
(dynamic batch and sequence export; profile 1x128 / 8x128 / 64x128, so the sequence is fixed at 128 by the profile).
For each model:

  dynamic N    one profile built with shape_buckets=N for N in --buckets; at each batch of --batches, on a fresh
               context: the first ctx.run (ms, synchronized), then the median (kiln.util.timing.measure: CUDA events,
               warm-up); the profile engine.select_profile picked, and its batch range
  static b     BuildConfig.with_shapes at the batch: the median the same way

Inputs are device-resident (fp32 images, int64 tokens; kiln keeps the IO precision). Every build records its wall
seconds, build_info's build_seconds, build_phases (exclusive seconds per phase), build_counts, stage seconds and
timing-cache hits. Builds (with their measurements) not started by --budget-seconds, or expected to end past it
(the model's slowest build so far per profile, times the build's profiles), are skipped and say so. The JSON is
rewritten after every build and model.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_shape_buckets --out /tmp/sb
    PYTHONPATH=src:. python -m benchmarks.probes.gpu_shape_buckets --smoke --device cpu --out /tmp/sb

--smoke: a tiny CNN (16x16 images) and a tiny BERT (seq 16), profile batch 1 / 2 / 4, batches 1, 2, 4.
Writes OUT/shape-buckets-DEVICE.json and .md, and prints the markdown at the end.
"""

from __future__ import annotations

import gc
import json
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

import kiln
from benchmarks.models import SPECS, Made, Spec, instantiate, onnx_file
from benchmarks.probes import harness
from benchmarks.suite import CACHE
from kiln.config import bucket_bounds
from kiln.util.timing import measure

MODELS = ("resnet50", "minilm")
SMOKE_NAMES = {"resnet50": "tiny-cnn", "minilm": "tiny-bert"}


@dataclass(frozen=True)
class Case:
    """A model: its suite spec, the image side or sequence length, the profile's (min, opt, max) batch, and whether
    the export's sequence axis is dynamic."""

    name: str
    spec: Spec
    size: int
    batches: tuple[int, int, int]
    dynamic_seq: bool = False

    def shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        if self.spec.task == "image":
            return {"input": (batch, 3, self.size, self.size)}
        return {n: (batch, self.size) for n in self.spec.input_names}

    def profile(self) -> dict[str, tuple]:
        ends = [self.shapes(b) for b in self.batches]
        return {n: tuple(e[n] for e in ends) for n in ends[0]}


def _tiny_cnn(size: int) -> Made:
    from benchmarks.probes.gpu_compile_vs_build import TinyCNN

    return Made(TinyCNN().eval(), f"tiny-cnn torch {torch.__version__}")


def _tiny_bert(size: int) -> Made:
    import transformers

    from tests.models.text import LastHidden, tiny_bert

    # vocab above Spec.inputs' token range (0..30000)
    return Made(LastHidden(tiny_bert(hidden=32, layers=1, heads=2, vocab=30522)),
                f"tiny-bert transformers {transformers.__version__}")


def cases(names: list[str], smoke: bool) -> list[Case]:
    if smoke:
        made = {"resnet50": Case("tiny-cnn", Spec("tiny-cnn", "image", _tiny_cnn, 16), 16, (1, 2, 4)),
                "minilm": Case("tiny-bert", Spec("tiny-bert", "text", _tiny_bert, 16), 16, (1, 2, 4), True)}
    else:
        made = {"resnet50": Case("resnet50", SPECS["resnet50"], 224, (1, 32, 64)),
                "minilm": Case("minilm", SPECS["minilm"], 128, (1, 8, 64), True)}
    return [made[n] for n in names]


# helpers


def _error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:400] if text else ''}"


def _guard(what: str, fn, budget: harness.Budget):
    """fn()'s result, or {"error": ...} (traceback on stderr): one failure never ends the run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded, and the probe goes on
        budget.log(f"{what} failed: {_error(e)}")
        traceback.print_exc()
        return {"error": _error(e)}


def _range(profile: dict, name: str | None = None) -> str:
    """A profile's batch range: 'min..max (opt o)' of its first (or the named) input's dim 0."""
    r = profile[name] if name in profile else next(iter(profile.values()))
    return f"{r.min[0]}..{r.max[0]} (opt {r.opt[0]})" if r.min[0] != r.max[0] else f"{r.min[0]}"


def _feeds(case: Case, engine, batch: int, device: str) -> dict[str, torch.Tensor]:
    inputs = case.spec.inputs(batch, case.size)
    known = set(engine.network.inputs)
    return {k: v.to(device) for k, v in inputs.items() if k in known}


def _first_ms(ctx, feeds: dict) -> float:
    harness.sync()
    start = time.perf_counter()
    ctx.run(feeds)
    harness.sync()
    return (time.perf_counter() - start) * 1e3


def _median_ms(ctx, feeds: dict, args) -> float:
    with torch.no_grad():
        return measure(lambda: ctx.run(feeds), device=args.device, warmup=args.warmup,
                       iterations=args.iterations).median


def _config(args, profiles, buckets: int = 1) -> kiln.BuildConfig:
    return kiln.BuildConfig(profiles=profiles, fp16=True, device=args.device, shape_buckets=buckets,
                            timing_cache=str(args.cache / "timing-cache.sqlite"))


def timed_build(path: Path, config: kiln.BuildConfig) -> tuple[object, dict]:
    """kiln.build, and what the build records about itself."""
    start = time.perf_counter()
    engine = kiln.build(path, config)
    harness.sync()
    wall = time.perf_counter() - start
    info = engine.build_info
    record = {"wall_s": wall, "build_seconds": info.get("build_seconds"), "build_phases": info.get("build_phases"),
              "build_counts": info.get("build_counts"), "stage_seconds": info.get("stage_seconds"),
              "warm_up_seconds": info.get("warm_up_seconds"), "timing_cache": info.get("timing_cache"),
              "profiles": [_range(p) for p in engine.config.profiles], "shape_buckets": info.get("shape_buckets"),
              "layers": info.get("layers"), "tactics": engine.tactic_summary(),
              "notes": [n for n in info.get("notes", []) if n.startswith("shape buckets")]}
    return engine, record


# the run


class Run:
    """The results, the budget, and writing the files."""

    def __init__(self, args, info: dict):
        self.args, self.info = args, info
        self.budget = harness.Budget(args.budget_seconds)
        slug = info["device"].lower().replace(" ", "-")
        self.json_path = args.out / f"shape-buckets-{slug}.json"
        self.md_path = args.out / f"shape-buckets-{slug}.md"
        self.results = {"probe": "shape-buckets", "precision": "fp16", "smoke": args.smoke,
                        "batches": args.batches, "buckets": args.buckets, "iterations": args.iterations,
                        "warmup": args.warmup, "budget_seconds": args.budget_seconds,
                        "timing": "kiln.util.timing.measure median (CUDA events on cuda), device-resident inputs, "
                                  "ctx.run; first call: one synchronized ctx.run on a fresh context",
                        "models": {}}

    def write(self) -> None:
        self.results["seconds"] = self.budget.elapsed
        self.args.out.mkdir(parents=True, exist_ok=True)
        tmp = self.json_path.with_name(f".{self.json_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.info | self.results, indent=1, default=str) + "\n")
        os.replace(tmp, self.json_path)
        self.md_path.write_text(render(self.info | self.results))

    def skip_reason(self, estimate: float) -> str | None:
        """Why a build (and its measurements), expected to take `estimate` seconds, is not started now, or None."""
        b = self.budget
        if b.left <= 0:
            return f"skipped: past --budget-seconds {self.args.budget_seconds:g} (at {b.elapsed:.0f} s)"
        if estimate > b.left:
            return (f"skipped: would end past --budget-seconds {self.args.budget_seconds:g} (at {b.elapsed:.0f} s; "
                    f"expected to take {estimate:.0f} s from this model's builds so far)")
        return None


def run_model(case: Case, run: Run) -> None:
    args, budget = run.args, run.budget
    m: dict = {"profile": {k: ["x".join(map(str, s)) for s in r] for k, r in case.profile().items()},
               "builds": {}, "rows": []}
    run.results["models"][case.name] = m
    reason = run.skip_reason(0.0)
    if reason:
        m["skipped"] = reason
        budget.log(f"{case.name}: {reason}")
        return

    def export() -> dict:
        start = time.perf_counter()
        made = instantiate(case.spec, case.size)
        path, cached = onnx_file(case.spec, made, case.size, args.cache, dynamic_seq=case.dynamic_seq)
        return {"source": made.source, "fallback": made.fallback, "onnx": str(path), "onnx_cached": cached,
                "export_s": time.perf_counter() - start}

    m["export"] = _guard(f"{case.name} export", export, budget)
    if "error" in m["export"]:
        run.write()
        return
    path = Path(m["export"]["onnx"])
    budget.log(f"{case.name}: exported {path.name} ({m['export']['export_s']:.1f} s, cached "
               f"{m['export']['onnx_cached']})")
    dyn: dict[int, dict[int, dict]] = {}
    static: dict[int, dict] = {}
    per_profile = 0.0  # the most seconds a build (with its measurements) took per profile, this model so far
    lo, _, hi = case.batches

    for n in args.buckets:
        key = f"dynamic N={n}"
        profiles = len(bucket_bounds(lo, hi, n))
        reason = run.skip_reason(per_profile * profiles)
        if reason:
            m["builds"][key] = {"skipped": reason}
            budget.log(f"{case.name} {key}: {reason}")
            continue
        budget.log(f"{case.name}: building {key}")
        start = time.perf_counter()
        built = _guard(f"{case.name} {key} build",
                       lambda: timed_build(path, _config(args, (case.profile(),), n)), budget)
        if isinstance(built, dict):
            m["builds"][key] = built
            run.write()
            continue
        engine, m["builds"][key] = built
        budget.log(f"{case.name} {key}: built in {m['builds'][key]['wall_s']:.1f} s, profiles "
                   f"{m['builds'][key]['profiles']}")
        dyn[n] = {}
        for b in args.batches:
            dyn[n][b] = _guard(f"{case.name} {key} b{b}", lambda: measure_dynamic(case, engine, b, args), budget)
            budget.log(f"{case.name} {key} b{b}: {_brief(dyn[n][b])}")
        engine = built = None  # freed before the next build
        _free()
        per_profile = max(per_profile, (time.perf_counter() - start) / profiles)
        run.write()

    for b in args.batches:
        key = f"static b{b}"
        reason = run.skip_reason(per_profile)
        if reason:
            m["builds"][key] = {"skipped": reason}
            static[b] = {"skipped": reason}
            budget.log(f"{case.name} {key}: {reason}")
            continue
        budget.log(f"{case.name}: building {key}")
        start = time.perf_counter()
        config = lambda: kiln.BuildConfig.with_shapes(case.shapes(b), fp16=True, device=args.device,  # noqa: E731
                                                      timing_cache=str(args.cache / "timing-cache.sqlite"))
        built = _guard(f"{case.name} {key} build", lambda: timed_build(path, config()), budget)
        if isinstance(built, dict):
            m["builds"][key] = static[b] = built
            run.write()
            continue
        engine, m["builds"][key] = built
        budget.log(f"{case.name} {key}: built in {m['builds'][key]['wall_s']:.1f} s")

        def measure_static() -> dict:
            ctx = engine.create_context()
            feeds = _feeds(case, engine, b, args.device)
            return {"first_call_ms": _first_ms(ctx, feeds), "median_ms": _median_ms(ctx, feeds, args)}

        static[b] = _guard(f"{case.name} {key}", measure_static, budget)
        budget.log(f"{case.name} {key}: {_brief(static[b])}")
        engine = built = None  # freed before the next build
        _free()
        per_profile = max(per_profile, time.perf_counter() - start)
        run.write()

    for b in args.batches:
        row: dict = {"batch": b, "static": static.get(b, {"skipped": "not built"}), "dynamic": {}}
        s = row["static"].get("median_ms")
        for n in args.buckets:
            d = dict(dyn.get(n, {}).get(b) or {"skipped": m["builds"].get(f"dynamic N={n}", {}).get(
                "skipped", "not built")})
            if "median_ms" in d and s:
                d["over_static"] = d["median_ms"] / s
            one = dyn.get(1, {}).get(b, {}).get("median_ms")
            if n != 1 and "median_ms" in d and one:
                d["over_n1"] = d["median_ms"] / one
            row["dynamic"][str(n)] = d
        m["rows"].append(row)
    run.write()


def measure_dynamic(case: Case, engine, batch: int, args) -> dict:
    """At `batch`: the profile picked, the first run on a fresh context, then the median on it."""
    feeds = _feeds(case, engine, batch, args.device)
    k = engine.select_profile({n: tuple(v.shape) for n, v in feeds.items()})
    out = {"profile": k, "profile_range": _range(engine.config.profiles[k]) if engine.config.profiles else None}
    ctx = engine.create_context()
    out["engine_first_run"] = batch == args.batches[0]  # also the engine's first run since its build
    out["first_call_ms"] = _first_ms(ctx, feeds)
    out["median_ms"] = _median_ms(ctx, feeds, args)
    return out


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _brief(m: dict) -> str:
    if "error" in m or "skipped" in m:
        return m.get("error") or m["skipped"]
    picked = f", profile {m['profile']} ({m['profile_range']})" if "profile" in m else ""
    return f"first {m['first_call_ms']:.1f} ms, median {m['median_ms']:.3f} ms{picked}"


# markdown


def _cell(m: dict | None, fmt: str = "{median_ms:.3f}") -> str:
    if not m:
        return "–"
    if "error" in m:
        return f"error: {m['error'][:80]}"
    if "skipped" in m:
        return m["skipped"].split(" (")[0]
    return fmt.format(**m)


def _phases(rec: dict) -> str:
    """Phases by seconds, largest first (those under 1 % of the build left out)."""
    phases = rec.get("build_phases") or {}
    total = sum(phases.values()) or 1.0
    top = sorted(phases.items(), key=lambda kv: -kv[1])
    return "; ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.01 * total) or "–"


def render(results: dict) -> str:
    buckets = results["buckets"]
    lines = [f"# Shape buckets: dynamic engines (shape_buckets=N) vs static engines, fp16 ({results['device']}, "
             f"{results['date']})", "",
             f"kiln {results['kiln']}, torch {results['torch']}, triton {results.get('triton')}. "
             f"{results['timing']}; median of {results['iterations']} after {results['warmup']} warm-up calls. "
             "Generated by `python -m benchmarks.probes.gpu_shape_buckets`.", ""]
    for name, m in results["models"].items():
        src = m.get("export", {})
        prof = "; ".join(f"{k} {'/'.join(v)}" for k, v in list(m["profile"].items())[:1])
        lines.append(f"- {name} ({src.get('source', src.get('error', m.get('skipped', '?')))}): profile min/opt/max "
                     f"{prof}")
    head = ["model", "batch", "static ms"]
    for n in buckets:
        head += [f"N={n} ms", f"N={n} ÷ static", f"N={n} profile", f"N={n} first ms"]
    lines += ["", "## Latency", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in results["models"].items():
        for r in m["rows"]:
            cells = [name, str(r["batch"]), _cell(r["static"])]
            for n in buckets:
                d = r["dynamic"].get(str(n), {})
                ok = "median_ms" in d
                cells += [_cell(d), f"{d['over_static']:.2f}×" if "over_static" in d else "–",
                          f"{d['profile']}: {d['profile_range']}" if ok else "–",
                          f"{d['first_call_ms']:.1f}" if ok else "–"]
            lines.append("| " + " | ".join(cells) + " |")
    head = ["model", "build", "wall s", "kiln s", "profiles", "timing cache hits/misses", "phases (s, largest first)",
            "counts"]
    lines += ["", "## Builds", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in results["models"].items():
        for key, rec in m["builds"].items():
            if "wall_s" not in rec:
                lines.append(f"| {name} | {key} | {_cell(rec)} |" + " |" * (len(head) - 3))
                continue
            tc = rec.get("timing_cache") or {}
            counts = ", ".join(f"{k} {v}" for k, v in (rec.get("build_counts") or {}).items()) or "–"
            cells = [name, key, f"{rec['wall_s']:.1f}", f"{rec['build_seconds']:.1f}", ", ".join(rec["profiles"]),
                     f"{tc.get('hits', '–')}/{tc.get('misses', '–')}", _phases(rec), counts]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict:
    ap = harness.parser(__doc__, out="/tmp/shape-buckets", out_help="folder for the JSON and markdown results")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)} "
                    "(with --smoke: their tiny stand-ins)")
    ap.add_argument("--batches", type=_ints, default=None, help="measured batches [default: 1,8,64; 1,2,4 with "
                    "--smoke]")
    ap.add_argument("--buckets", type=_ints, default=[1, 3], help="shape_buckets values of the dynamic engines")
    ap.add_argument("--cache", type=Path, default=CACHE, help="folder for the timing cache and the ONNX exports")
    ap.add_argument("--budget-seconds", type=float, default=480.0, help="builds not started by then are skipped")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--smoke", action="store_true", help="a tiny CNN and a tiny BERT, batches 1, 2, 4 (CPU-quick)")
    ap.add_argument("--iterations", type=int, default=None, help="timed calls per engine and batch [default: 50; "
                    "5 with --smoke]")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here; pass --device cpu (with --smoke for tiny models)")
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    if not names or any(n not in MODELS for n in names):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    args.batches = args.batches or ([1, 2, 4] if args.smoke else [1, 8, 64])
    if not args.buckets or any(not 1 <= n <= 16 for n in args.buckets):
        ap.error("--buckets: values in 1..16")
    args.iterations = args.iterations or (5 if args.smoke else 50)
    args.warmup = 2 if args.smoke else 10
    info = harness.banner(args.device)
    run = Run(args, info)
    run.budget.log(f"writing {run.json_path}; models {', '.join(c.name for c in cases(names, args.smoke))}, "
                   f"batches {args.batches}, buckets {args.buckets}")
    for case in cases(names, args.smoke):
        try:
            run_model(case, run)
        except Exception as e:  # noqa: BLE001 - a model that fails is recorded, the next one still runs
            traceback.print_exc()
            run.results["models"].setdefault(case.name, {"profile": {}, "builds": {}, "rows": []})["error"] = \
                _error(e)
        run.write()
        run.budget.log(f"{case.name}: done; wrote {run.json_path}")
    run.write()
    print(render(info | run.results), flush=True)
    run.budget.log(f"wrote {run.json_path} and {run.md_path}")
    return run.results


if __name__ == "__main__":
    main()
