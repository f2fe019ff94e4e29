"""`python -m benchmarks.dynamic`: one kiln engine built for a range of shapes, against kiln engines built for one shape
each and the torch modes, at every shape of a sweep (issue 23, part 6).

MiniLM-L6 and BERT-base (exported with dynamic batch and sequence) sweep batch x sequence 1x16 .. 32x512 with one fp16
engine of one profile min 1x16 / opt 8x128 / max 32x512 on all three inputs; ResNet-50 sweeps batch 1 .. 64 at 224
with min 1 / opt 32 / max 64. At each shape, on the same inputs and with the same loop (call, synchronize), each
contender's first two calls are timed, then --repeats calls of each after 10 warm-up calls, interleaved: 5 rounds, each
contender in turn (the order rotating), so a drift of the GPU's clocks or the host's load during the row touches every
contender alike; the median of each contender's calls, and each round's median beside it:

  kiln_dynamic     the one dynamic engine: its first call at the shape, then the median
  kiln_static      an engine built for exactly the shape (build seconds, median); its outputs against the dynamic's
  eager            torch eager fp16 (CNNs channels_last, as in the suite)
  compile_dynamic  torch.compile(dynamic=True), compiled once per model: first call at the shape, median
  reduce_overhead  torch.compile(mode="reduce-overhead", dynamic=False): recompiles at each shape; first call, median

Each row is written as soon as it is measured to <out>/dynamic-<device>-<date>.json and .md, merged with that day's
file (rows keyed by model and shape; the later wins), so a run cut off keeps what it measured. Split a sweep over
several calls with --models and --shapes (`--shapes 1x16,8`: two-dimensional shapes go to text models, one-dimensional
batches to ResNet-50), or rerun the same command with --resume to measure only the shapes the file lacks.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import kiln
from benchmarks.models import SPECS, Spec, instantiate, onnx_file
from benchmarks.peers import cast_inputs, prepare
from benchmarks.probes.harness import Budget, calls_ms, sync
from benchmarks.suite import CACHE, RESULTS, accuracy, device_info, guarded, versions

MODELS = ("minilm", "bert", "resnet50")
SHAPES = {"text": [(1, 16), (4, 64), (8, 128), (16, 256), (32, 512)], "image": [(1,), (8,), (32,), (64,)]}
RANGES = {"text": ((1, 16), (8, 128), (32, 512)), "image": ((1,), (32,), (64,))}  # min, opt, max
IMAGE_SIZE = 224
WARMUP = 10
PEERS = ("eager", "compile_dynamic", "reduce_overhead")
ROUNDS = 5

Shape = tuple[int, ...]


def label(shape: Shape) -> str:
    return "x".join(map(str, shape))


def parse_shapes(text: str) -> list[Shape]:
    """'1x16,4x64' → [(1, 16), (4, 64)]; '8' → [(8,)]."""
    try:
        shapes = [tuple(int(d) for d in item.strip().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write shapes as BATCHxSEQ or BATCH, comma-separated") from None
    if not shapes or any(len(s) > 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"{text!r}: write shapes as BATCHxSEQ (text) or BATCH (image), each >= 1")
    return shapes


def shapes_for(spec: Spec, shapes: list[Shape] | None) -> list[Shape]:
    """The sweep's shapes for `spec` (the default, or those of `shapes` of its rank), each inside its profile."""
    rank = len(RANGES[spec.task][0])
    mine = SHAPES[spec.task] if shapes is None else [s for s in shapes if len(s) == rank]
    lo, _, hi = RANGES[spec.task]
    for s in mine:
        if not all(a <= d <= b for a, d, b in zip(lo, s, hi)):
            raise ValueError(f"{spec.name}: shape {label(s)} is outside its profile {label(lo)}..{label(hi)}")
    return mine


def input_shapes(spec: Spec, shape: Shape) -> dict[str, Shape]:
    if spec.task == "text":
        return {n: shape for n in spec.input_names}
    return {"input": (shape[0], 3, IMAGE_SIZE, IMAGE_SIZE)}


def profile(spec: Spec) -> dict[str, tuple[Shape, Shape, Shape]]:
    """The dynamic engine's one profile: {input name: (min, opt, max)}."""
    ends = [input_shapes(spec, s) for s in RANGES[spec.task]]
    return {n: tuple(e[n] for e in ends) for n in spec.input_names}


def ratios(row: dict) -> dict:
    """`dynamic_over_static` (dynamic ms ÷ static ms), the best peer, `speedup_vs_best_peer` (its ms ÷ dynamic ms)."""
    dyn, static = row["kiln_dynamic"].get("median_ms"), row["kiln_static"].get("median_ms")
    if dyn and static:
        row["dynamic_over_static"] = dyn / static
    ok = {p: m["median_ms"] for p, m in row.get("peers", {}).items() if "median_ms" in m}
    if ok:
        row["best_peer"] = min(ok, key=ok.get)
        if dyn:
            row["speedup_vs_best_peer"] = ok[row["best_peer"]] / dyn
    return row


def first_calls(fn: Callable[[], object], keep: dict | None = None) -> dict:
    """fn()'s first and second calls (ms, synchronized); `keep` gets a copy of the first call's outputs (a dict of
    tensors). The garbage of earlier contenders (engines, compiled modules, CUDA graphs) is collected first, so no
    first call pays for another's; what the first call still spent in garbage collection and how many device
    allocations it made are recorded beside it."""
    gc.collect()
    with first_call_costs() as costs:
        start = time.perf_counter()
        out = fn()
        sync()
        first = (time.perf_counter() - start) * 1e3
    if keep is not None:
        keep.update({k: v.clone() for k, v in out.items() if isinstance(v, torch.Tensor)})
    start = time.perf_counter()
    fn()
    sync()
    second = (time.perf_counter() - start) * 1e3  # a kiln dynamic engine captures a new shape's graph here
    return {"first_call_ms": first, "second_call_ms": second, "first_call_costs": costs}


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, rounds: int = ROUNDS) -> dict[str, dict]:
    """Per contender: the median ms of `repeats` synchronized calls after WARMUP, taken in `rounds` rounds in which
    every contender runs its share in turn (the order rotating), and each round's median; {"error": ...} for one
    that fails (the others go on)."""
    times: dict[str, list[float]] = {n: [] for n in fns}
    per_round: dict[str, list[float]] = {n: [] for n in fns}
    out: dict[str, dict] = {}
    for name, fn in fns.items():
        out[name] = guarded(f"{name} warm-up", lambda fn=fn: {"warmup": len(calls_ms(fn, WARMUP))})
    share = [repeats // rounds + (r < repeats % rounds) for r in range(rounds)]
    for r in range(rounds):
        names = [n for n in fns if "error" not in out[n]]
        for name in names[r % len(names):] + names[:r % len(names)] if names else []:
            try:  # not `guarded`: its empty_cache between contenders would make the next one allocate again
                ms = calls_ms(fns[name], share[r])
            except Exception as e:  # recorded, and the others go on
                out[name] = {"error": f"timed calls failed: {type(e).__name__}: {e}"[:300]}
                continue
            times[name] += ms
            if ms:
                per_round[name].append(float(np.median(ms)))
    for name in fns:
        if "error" not in out[name]:
            out[name] = {"median_ms": float(np.median(times[name])), "round_medians_ms": per_round[name]}
    return out


@contextlib.contextmanager
def first_call_costs():
    """A dict filled when the block ends: garbage collections in it and their ms ("gc_ms", "gc_runs"), and on a GPU
    the caching allocator's device allocations and frees ("device_allocs", "device_frees")."""
    costs, started = {"gc_ms": 0.0, "gc_runs": 0}, []

    def on_gc(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            costs["gc_ms"] += (time.perf_counter() - started.pop()) * 1e3
            costs["gc_runs"] += 1

    cuda = torch.cuda.is_available()
    before = torch.cuda.memory_stats() if cuda else {}
    gc.callbacks.append(on_gc)
    try:
        yield costs
    finally:
        gc.callbacks.remove(on_gc)
        if cuda:
            after = torch.cuda.memory_stats()
            names = {"num_device_alloc": "device_allocs", "num_device_free": "device_frees"}
            costs |= {mine: after.get(k, 0) - before.get(k, 0) for k, mine in names.items()}


def _config(args, profiles) -> kiln.BuildConfig:
    """fp16, the suite's timing cache (shared by every build), on --device."""
    return kiln.BuildConfig(profiles=profiles, device=args.device, fp16=True,
                            timing_cache=str(args.cache / "timing-cache.sqlite"))


def bench_static(path: Path, feeds: dict, args, keep: dict, calls: dict) -> dict:
    """Build seconds, timing cache and first calls of an engine built for exactly these feeds' shapes; its call goes
    into `calls` as "kiln_static"."""
    engine = kiln.build(path, _config(args, ({k: (tuple(v.shape),) * 3 for k, v in feeds.items()},)))
    ctx = engine.create_context()
    info = engine.build_info
    calls["kiln_static"] = lambda: ctx.run(feeds)
    return {"build_seconds": info["build_seconds"], "timing_cache": info.get("timing_cache")} | first_calls(
        calls["kiln_static"], keep)


def peer_call(fn: Callable, call_args: list[torch.Tensor]) -> Callable[[], object]:
    def call():
        with torch.no_grad():
            return fn(*call_args)
    return call


def bench_shape(spec: Spec, shape: Shape, model: dict, args, budget: Budget) -> dict:
    """One row: every contender at `shape`, on the same inputs: first calls one after another, then the timed calls
    interleaved."""
    inputs = spec.inputs(shape[0], shape[1] if spec.task == "text" else IMAGE_SIZE)
    feeds = {k: v.to(args.device) for k, v in inputs.items()}
    row = {"model": spec.name, "shape": label(shape), "batch": shape[0],
           "input_shapes": {k: list(v.shape) for k, v in inputs.items()}}
    where = f"{spec.name} {label(shape)}"
    dyn_out, static_out, calls = {}, {}, {}
    ctx = model["ctx"]
    row["kiln_dynamic"] = guarded("kiln dynamic", lambda: first_calls(lambda: ctx.run(feeds), dyn_out))
    row["kiln_dynamic"]["eager_reasons"] = sorted(set(ctx.eager_reasons.values()))  # signatures run without a graph
    calls["kiln_dynamic"] = lambda: ctx.run(feeds)
    budget.log(f"{where}: kiln dynamic {_brief(row['kiln_dynamic'])}; building the static engine")
    row["kiln_static"] = guarded("kiln static", lambda: bench_static(model["path"], feeds, args, static_out, calls))
    budget.log(f"{where}: kiln static {_brief(row['kiln_static'])}")
    if dyn_out and static_out:
        names = [n for n in static_out if n in dyn_out]
        row["dynamic_vs_static"] = accuracy(names, [dyn_out[n] for n in names], [static_out[n] for n in names])
        row["max_abs_diff"] = max(a["max_abs_err"] for a in row["dynamic_vs_static"].values())
    entries = {"kiln_dynamic": row["kiln_dynamic"], "kiln_static": row["kiln_static"]}
    if model.get("peers"):
        row["peers"] = {}
        call_args = cast_inputs(inputs, "fp16", args.device, spec.channels_last)
        for peer, fn in model["peers"].items():
            calls[peer] = peer_call(fn, call_args)
            row["peers"][peer] = entries[peer] = guarded(peer, lambda: first_calls(calls[peer]))
            budget.log(f"{where}: {peer} {_brief(row['peers'][peer])}")
    live = {n: c for n, c in calls.items() if n in entries and "error" not in entries[n]}
    for name, got in interleaved(live, args.repeats).items():
        entries[name] |= got
    budget.log(f"{where}: medians " + ", ".join(f"{n} {m['median_ms']:.3f}" for n, m in entries.items()
                                                if "median_ms" in m) + " ms")
    return ratios(row)


def _brief(m: dict) -> str:
    if "error" in m:
        return m["error"]
    build = f", build {m['build_seconds']:.1f} s" if "build_seconds" in m else ""
    c = m.get("first_call_costs", {})
    costs = f" (gc {c['gc_ms']:.1f} ms, {c.get('device_allocs', 0)} device allocs)" if c else ""
    return f"first {m['first_call_ms']:.1f} ms{costs}{build}"


def setup_model(spec: Spec, args, budget: Budget, info: dict) -> dict:
    """The dynamic-shape export, the one dynamic engine and (unless --skip-peers) the torch peers; `info` gets what
    the results file says about the model."""
    start = time.perf_counter()
    made = instantiate(spec, spec.default_size)
    path, cached = onnx_file(spec, made, spec.default_size, args.cache, dynamic_seq=True)
    info |= {"source": made.source, "fallback": made.fallback, "onnx": path.name, "onnx_cached": cached,
             "export_seconds": time.perf_counter() - start,
             "profile": {k: [label(s) for s in r] for k, r in profile(spec).items()}}
    budget.log(f"{spec.name}: exported ({path.name}); building the dynamic engine")
    engine = kiln.build(path, _config(args, (profile(spec),)))
    info |= {"dynamic_build_seconds": engine.build_info["build_seconds"],
             "dynamic_timing_cache": engine.build_info.get("timing_cache"), "dynamic_tactics": engine.tactic_summary(),
             "dynamic_warm_up_seconds": engine.build_info.get("warm_up_seconds")}
    budget.log(f"{spec.name}: dynamic engine built in {info['dynamic_build_seconds']:.1f} s")
    model = {"path": path, "engine": engine, "ctx": engine.create_context()}
    if not args.skip_peers:
        module, _ = prepare(made.module, {}, "fp16", args.device, spec.channels_last)
        torch._dynamo.reset()
        model["peers"] = {"eager": module, "compile_dynamic": torch.compile(module, dynamic=True),
                          "reduce_overhead": torch.compile(module, mode="reduce-overhead", dynamic=False)}
    return model


# results files


def paths(results: dict, folder: Path) -> tuple[Path, Path]:
    stem = f"dynamic-{results['device']['slug']}-{results['date']}"
    return folder / f"{stem}.json", folder / f"{stem}.md"


def _order(row: dict) -> tuple:
    return (MODELS.index(row["model"]) if row["model"] in MODELS else len(MODELS), row["model"],
            [int(d) for d in row["shape"].split("x")])


def merge(old: dict, new: dict) -> dict:
    """`new` with `old`'s rows, runs and models kept where `new` has none of the same key (model and shape; run start;
    model name)."""
    rows = {(r["model"], r["shape"]): r for r in old["rows"] + new["rows"]}
    runs = {r["started"]: r for r in old["runs"] + new["runs"]}
    return new | {"rows": sorted(rows.values(), key=_order), "runs": list(runs.values()),
                  "models": old["models"] | new["models"]}


def write(results: dict, folder: Path) -> tuple[Path, Path]:
    """The JSON (merged with the same device and day's file, replaced atomically) and its Markdown table."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = paths(results, folder)
    if json_path.is_file():
        results = merge(json.loads(json_path.read_text()), results)
    tmp = json_path.with_name(f".{json_path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(tmp, json_path)
    md_path.write_text(render(results))
    return json_path, md_path


def _ms(m: dict | None, notes: list[str], extra: str = "") -> str:
    if not m:
        return "–"
    if "error" in m:
        notes.append(m["error"])
        return f"error [{len(notes)}]"
    return f"{m['median_ms']:.3f}" + (f" ({extra.format(**m)})" if extra else "")


def render(results: dict) -> str:
    v, rows, notes = results["versions"], results["rows"], []
    run = results["runs"][-1]
    lines = [f"# Dynamic shapes: one kiln engine per profile, an engine per shape, torch ({results['device']['name']}, "
             f"{results['date']})", "",
             f"kiln {v['kiln']}, torch {v['torch']}, triton {v.get('triton')}, CUDA {v.get('cuda')}; fp16; "
             f"{run['settings']['timing']}. Generated by `python -m benchmarks.dynamic`.", ""]
    for name, m in results["models"].items():
        by_range: dict[str, list[str]] = {}
        for k, r in m.get("profile", {}).items():
            by_range.setdefault("/".join(r), []).append(k)
        ranges = "; ".join(f"{', '.join(names)} {r}" for r, names in by_range.items())
        built = f", dynamic engine built in {m['dynamic_build_seconds']:.1f} s" if "dynamic_build_seconds" in m else ""
        lines.append(f"- {name} ({m.get('source')}): profile min/opt/max {ranges}{built}")
    lines += ["", "ms: median after warm-up (first call at the shape, ms, and for kiln dynamic the second, where it "
              "captures the shape's CUDA graph; for static: build seconds). "
              "Ratios: dynamic ÷ static, best torch ÷ kiln dynamic (higher is better for kiln).", "",
              "| model | shape | kiln dynamic | kiln static | dyn ÷ static | eager | compile dynamic=True "
              "| reduce-overhead | best torch ÷ dyn | max abs diff |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    first = "first {first_call_ms:.0f}"
    first_second = "first {first_call_ms:.0f}, second {second_call_ms:.0f}"
    for r in rows:
        if "error" in r:
            notes.append(r["error"])
            lines.append(f"| {r['model']} | {r['shape']} | error [{len(notes)}] |" + " |" * 7)
            continue
        peers = r.get("peers", {})
        dyn = r["kiln_dynamic"]
        cells = [_ms(dyn, notes, first_second if "second_call_ms" in dyn else first),
                 _ms(r["kiln_static"], notes, "{build_seconds:.0f} s"),
                 _fmt(r.get("dynamic_over_static"), "×"), _ms(peers.get("eager"), notes),
                 _ms(peers.get("compile_dynamic"), notes, first), _ms(peers.get("reduce_overhead"), notes, first),
                 _fmt(r.get("speedup_vs_best_peer"), f"× ({r['best_peer']})" if "best_peer" in r else "×"),
                 _fmt(r.get("max_abs_diff"), "", ".2g")]
        lines.append(f"| {r['model']} | {r['shape']} | " + " | ".join(cells) + " |")
    lines += ["", *goals(rows)]
    if notes:
        lines += ["", "Errors:", *[f"{i}. {n}" for i, n in enumerate(notes, 1)]]
    return "\n".join(lines) + "\n"


def _fmt(x: float | None, unit: str, spec: str = ".2f") -> str:
    return "–" if x is None else f"{x:{spec}}{unit}"


def goals(rows: list[dict]) -> list[str]:
    """Issue 23's bars, worst row of each: dynamic ≤ 1.15× static, ≥ 1.3× the best torch mode, first call ≤ 50 ms."""
    out = []
    for key, bar, worst, text in (("dynamic_over_static", 1.15, max, "dynamic ÷ static ≤ 1.15×"),
                                  ("speedup_vs_best_peer", 1.3, min, "best torch ÷ kiln dynamic ≥ 1.3×")):
        got = [r for r in rows if r.get(key) is not None]
        if got:
            w = worst(got, key=lambda r: r[key])
            ok = w[key] <= bar if worst is max else w[key] >= bar
            out.append(f"- {text}: {'met' if ok else 'NOT met'}, worst {w[key]:.2f}× ({w['model']} {w['shape']})")
    firsts = [r for r in rows if "first_call_ms" in r.get("kiln_dynamic", {})]
    if firsts:
        w = max(firsts, key=lambda r: r["kiln_dynamic"]["first_call_ms"])
        ms = w["kiln_dynamic"]["first_call_ms"]
        out.append(f"- kiln dynamic first call at a shape ≤ 50 ms: {'met' if ms <= 50 else 'NOT met'}, worst "
                   f"{ms:.1f} ms ({w['model']} {w['shape']})")
        seconds = [r for r in firsts if "second_call_ms" in r["kiln_dynamic"]]
        if seconds:
            w = max(seconds, key=lambda r: r["kiln_dynamic"]["second_call_ms"])
            out.append(f"- kiln dynamic second call (the CUDA graph capture), worst "
                       f"{w['kiln_dynamic']['second_call_ms']:.1f} ms ({w['model']} {w['shape']})")
    return out


# the run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dynamic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=lambda s: [m.strip() for m in s.split(",") if m.strip()], default=list(MODELS),
                   help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="e.g. 1x16,4x64 (text: BATCHxSEQ) or 1,8 (ResNet-50: BATCH); default the whole sweep")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for dynamic-<device>-<date>.json and .md")
    p.add_argument("--cache", type=Path, default=CACHE, help="folder for ONNX exports and the timing cache")
    p.add_argument("--skip-peers", action="store_true", help="kiln only: no torch eager or torch.compile")
    p.add_argument("--repeats", type=int, default=100, help="timed calls per contender and shape (median)")
    p.add_argument("--resume", action="store_true", help="skip the shapes that the day's results file already has")
    p.add_argument("--budget-seconds", type=float, default=540.0,
                   help="stop before a shape (or model) once the slowest shape so far would end past this")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke test only")
    args = p.parse_args(argv)
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        p.error(f"unknown models {bad}; choose from {', '.join(MODELS)}")
    try:
        args.sweep = {m: shapes_for(SPECS[m], args.shapes) for m in args.models}
    except ValueError as e:
        p.error(str(e))
    if not any(args.sweep.values()):
        p.error("no --shapes fit the models: BATCHxSEQ for minilm and bert, BATCH for resnet50")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    budget = Budget(args.budget_seconds)
    torch.backends.cudnn.benchmark = True  # as in the suite, for every contender alike
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)  # a compile per shape
    now = datetime.now(timezone.utc)
    run = {"started": now.isoformat(timespec="seconds"), "argv": argv, "settings": {
        "timing": f"call, synchronize; median of {args.repeats} after {WARMUP} warm-up calls, the contenders "
        f"interleaved in {ROUNDS} rounds", "repeats": args.repeats, "rounds": ROUNDS,
        "warmup": WARMUP, "cudnn_benchmark": True, "peer_setup": "model and float inputs in fp16 (CNNs channels_last) "
        "on the device; torch.no_grad; kiln takes the same inputs in fp32 (keep_io_precision)"}}
    results = {"device": device_info(args.device), "date": now.date().isoformat(), "versions": versions(),
               "runs": [run], "models": {}, "rows": []}
    json_path, _ = paths(results, args.out)
    done = set()
    if args.resume and json_path.is_file():
        done = {(r["model"], r["shape"]) for r in json.loads(json_path.read_text())["rows"]}
    budget.log(f"{results['device']['name']}; torch {torch.__version__}, kiln {kiln.__version__}; writing {json_path}")

    def emit(row: dict) -> None:
        run["seconds"] = budget.elapsed
        results["rows"].append(row)
        write(results, args.out)

    longest = 0.0  # the slowest shape so far, seconds, leaving out each model's first (its one-time compiles)
    for name in args.models:
        spec, todo = SPECS[name], [s for s in args.sweep[name] if (name, label(s)) not in done]
        if not todo:
            budget.log(f"{name}: nothing to measure")
            continue
        if budget.left < longest:
            budget.log(f"budget spent: not measured {name} {','.join(map(label, todo))}")
            continue
        info = results["models"].setdefault(name, {})
        model = guarded(f"{name} setup", lambda: setup_model(spec, args, budget, info))
        if "error" in model:
            for s in todo:
                emit({"model": name, "shape": label(s), "batch": s[0], "error": f"setup failed: {model['error']}"})
            continue
        for i, shape in enumerate(todo):
            if budget.left < longest:
                budget.log(f"budget spent: not measured {name} {','.join(map(label, todo[i:]))} (rerun with --resume)")
                break
            start = time.perf_counter()
            emit(bench_shape(spec, shape, model, args, budget))
            if i:  # a cold torch.compile(dynamic=True) took 243-261 s at BERT's first shape, then seconds
                longest = max(longest, time.perf_counter() - start)
        del model
        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    json_path, md_path = write(results, args.out)
    budget.log(f"wrote {json_path} and {md_path}")
    return results


if __name__ == "__main__":
    main()
