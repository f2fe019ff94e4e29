"""`python -m benchmarks.suite`: kiln and the torch peers side by side in one run, written to one results file.

For each model × batch × precision: export to ONNX (cached), build the kiln engine and check it against torch,
time kiln and every peer on the same inputs, and compute the row's roofline floor. See benchmarks/NOTES.md.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import re
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import onnx
import torch

import kiln
from benchmarks import report
from benchmarks.models import SPECS, Made, Spec, instantiate, onnx_file
from benchmarks.peers import OPT_IN, PEERS, prepare, runner
from benchmarks.roofline import DTYPES, count_flops, matmul_rate
from kiln.bench import measure
from kiln.target.device import detect

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CACHE = ROOT / ".kiln-cache" / "benchmarks"  # git-ignored; kept between calls on a warm machine
TIMING = {False: dict(warmup=10, iterations=50, duration=10.0), True: dict(warmup=2, iterations=5, duration=2.0)}
# kiln's quantized precisions: calibrated on CALIB_SAMPLES random inputs other than the measured ones; torch has no
# automatic int8/fp8, so their peers run fp16 (the bar the issue sets: the best torch fp16 mode in the same run)
QUANTIZED = ("int8", "fp8")
CALIB_SAMPLES = 32
PRECISIONS = (*DTYPES, *QUANTIZED)


class Budget:
    """Wall-clock seconds this run may spend, checked before each model, row and step; a step is skipped when
    less is left than the longest run of the same step (kiln or a peer) so far, since none can be interrupted."""

    def __init__(self, seconds: float):
        self.seconds, self.start, self.exhausted = seconds, time.perf_counter(), False
        self.cost: dict[str, float] = {}

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def spent(self, step: str | None = None) -> bool:
        over = self.elapsed + self.cost.get(step, 0.0) >= self.seconds
        self.exhausted |= over
        return over

    def step(self, step: str, fn: Callable[[], dict]) -> dict:
        """fn() (guarded), its duration remembered as the step's cost."""
        start = time.perf_counter()
        result = guarded(step, fn)
        self.cost[step] = max(self.cost.get(step, 0.0), time.perf_counter() - start)
        return result


def _csv(choices) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list whose items must be among `choices`."""
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items
    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=_csv(SPECS), default=list(SPECS), help="comma-separated: " + ", ".join(SPECS))
    p.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 64])
    p.add_argument("--precisions", type=_csv(PRECISIONS), default=["fp16"],
                   help="fp16, bf16, fp32, int8, fp8 (quantized rows: kiln calibrated, peers in fp16)")
    p.add_argument("--peers", type=_csv(PEERS), default=[p for p in PEERS if p not in OPT_IN],
                   help="eager, default, reduce-overhead, max-autotune (the last only for --max-autotune models)")
    p.add_argument("--max-autotune", type=_csv(SPECS), default=[],
                   help="models that also get torch.compile max-autotune (minutes of compiling each)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="few warm-up and timed iterations")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for <device>-<date>.json and .md")
    p.add_argument("--cache", type=Path, default=CACHE, help="folder for ONNX exports and the timing cache")
    p.add_argument("--budget-seconds", type=float, default=480.0,
                   help="skip a step (kiln or a peer in a row) once it would end past this many seconds, judged "
                        "by its longest run so far")
    p.add_argument("--peer-runs", type=int, default=1,
                   help="prepare, compile and time each peer this many times afresh and keep its fastest run")
    p.add_argument("--image-size", type=int, default=None, help="image side for vision models (default 224)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence length for text models (default 128)")
    args = p.parse_args(argv)
    if set(OPT_IN) & set(args.peers) and not args.max_autotune:
        p.error("max-autotune compiles for minutes per row: name its models with --max-autotune MODEL,...")
    return args


def _error(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:500]


def guarded(what: str, fn: Callable[[], dict]) -> dict:
    """fn()'s result, or {"error": ...} with the traceback on stderr: one failure never ends the run."""
    try:
        return fn()
    except Exception as e:  # recorded in the row, and the suite goes on
        print(f"  {what} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        return {"error": _error(e)}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def timed(fn: Callable[[], object], device: str, batch: int, quick: bool) -> dict:
    stats = measure(fn, device=device, batch=batch, **TIMING[quick])
    return {"median_ms": stats.median, "items_per_s": batch * 1e3 / stats.median, "p90_ms": stats.p90,
            "iterations": stats.count, "warmup": stats.warmup}


def _as_list(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def reference(made: Made, inputs: dict[str, torch.Tensor], device: str) -> list[torch.Tensor]:
    """torch's fp32 outputs on `device` (TF32 off), what kiln's outputs are checked against."""
    model, args = prepare(made.module, inputs, "fp32", device, channels_last=False)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            return [t.float() for t in _as_list(model(*args))]
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def accuracy(names: list[str], got: list[torch.Tensor], want: list[torch.Tensor]) -> dict:
    """Per output: cosine similarity and max |got − want| ÷ max |want| (relative to the output's scale)."""
    out = {}
    for name, g, w in zip(names, got, want):
        g, w = g.double().flatten(), w.double().flatten().to(g.device)
        err = (g - w).abs().max().item()
        out[name] = {"cosine": torch.nn.functional.cosine_similarity(g, w, dim=0).item(),
                     "max_rel_err": err / max(w.abs().max().item(), 1e-30), "max_abs_err": err}
    return out


def rejected_candidates(engine) -> dict[str, dict[str, int]]:
    """Every tactic a layer did not get and why, by tactic and reason (layers counted): refused up front (cannot run
    the layer), left out (superseded), compiled and failed its check, or timed slower than the winner. MobileNetV2 at
    batch 1 sometimes built with no Triton conv at all (0.35 against 0.2 ms); this says why next time."""
    out: dict[str, dict[str, int]] = {}
    for choice in engine.tactics.values():
        losers = {str(label).split("{")[0] for label, _ in getattr(choice, "timed", None) or ()} - {choice.tactic}
        lost = [(name, "timed slower than the winner") for name in losers]
        for label, why in [*(getattr(choice, "rejected", None) or ()), *lost]:
            reasons = out.setdefault(str(label).split("{")[0], {})
            reasons[str(why)[:160]] = reasons.get(str(why)[:160], 0) + 1
    return out


def bench_kiln(spec: Spec, path: Path, inputs: dict, want: list, precision: str, args) -> dict:
    """Build the engine (build time recorded), check it against torch, time it."""
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    timing_cache = str(args.cache / "timing-cache.sqlite") if args.device == "cuda" else None
    calib, quant = None, {}
    if precision in QUANTIZED:
        n = min(next(iter(shapes.values()))[0], 8)
        size = args.image_size if spec.task == "image" else args.seq_len
        calib = [{k: v.numpy() for k, v in spec.inputs(n, size or spec.default_size, seed=100 + i).items()}
                 for i in range(max(1, CALIB_SAMPLES // n))]
        quant = {precision: True, "calibrator": "entropy"}
    config = kiln.BuildConfig.with_shapes(shapes, device=args.device, fp16=precision == "fp16",
                                          bf16=precision == "bf16", opt_level=3, timing_cache=timing_cache, **quant)
    engine = kiln.build(path, config, calib_data=calib)
    ctx = engine.create_context()
    feeds = {k: v.to(args.device) for k, v in inputs.items()}
    outs = ctx.run(feeds)
    info = engine.build_info
    result = {"build_seconds": info["build_seconds"], "tactics": info.get("tactics"),
              "timing_cache": info.get("timing_cache"), "build_notes": info.get("notes"),
              "build_phases": info.get("build_phases"), "build_counts": info.get("build_counts"),
              "build_check_seconds": info.get("build_check_seconds"),
              "rejected_candidates": rejected_candidates(engine),
              "accuracy": accuracy(spec.output_names, [outs[n] for n in spec.output_names], want)}
    return result | timed(lambda: ctx.run(feeds), args.device, next(iter(shapes.values()))[0], args.quick)


def bench_peer(peer: str, spec: Spec, made: Made, inputs: dict, precision: str, args) -> dict:
    """The peer prepared, compiled and timed --peer-runs times afresh; the fastest run, with every run's median
    (torch.compile's result moved by up to 1.6x between runs on one GPU: BERT-base reduce-overhead, 2026-11-28)."""
    precision = "fp16" if precision in QUANTIZED else precision
    runs = []
    for _ in range(args.peer_runs):
        model, call_args = prepare(made.module, inputs, precision, args.device, spec.channels_last)
        call, first_s = runner(peer, model, call_args)
        runs.append({"first_call_seconds": first_s} | timed(call, args.device, call_args[0].shape[0], args.quick))
        torch._dynamo.reset()
    best = min(runs, key=lambda r: r["median_ms"])
    return best | ({"run_medians_ms": [r["median_ms"] for r in runs]} if len(runs) > 1 else {})


def ratios(row: dict, rate: float | None) -> None:
    """Best peer, kiln ÷ best peer (as speed), the compute floor and kiln's fraction of it, from the row's figures."""
    ok = {p: m for p, m in row["peers"].items() if "median_ms" in m}
    kiln_ms = row["kiln"].get("median_ms")
    if ok:
        row["best_peer"] = min(ok, key=lambda p: ok[p]["median_ms"])
        if kiln_ms:
            row["speedup_vs_best_peer"] = ok[row["best_peer"]]["median_ms"] / kiln_ms
    if row.get("flops") and rate:
        row["matmul_flops_per_s"] = rate
        row["floor_ms"] = row["flops"] / rate * 1e3
        row["floor_items_per_s"] = row["batch"] * 1e3 / row["floor_ms"]
        if kiln_ms:
            row["kiln_fraction_of_floor"] = row["floor_ms"] / kiln_ms


def bench_row(spec: Spec, made: Made, path: Path, inputs: dict, want: list, precision: str, args,
              budget: Budget, row: dict, rate: float | None) -> dict:
    print(f"[{budget.elapsed:6.1f} s] {spec.name} b{row['batch']} {precision}: kiln", flush=True)
    row["kiln"] = budget.step("kiln", lambda: bench_kiln(spec, path, inputs, want, precision, args))
    row["peers"] = {}
    peers = [p for p in args.peers if p not in OPT_IN] + (list(OPT_IN) if spec.name in args.max_autotune else [])
    for peer in peers:
        if budget.spent(peer):
            row["peers"][peer] = {"skipped": "budget spent"}
            continue
        print(f"[{budget.elapsed:6.1f} s] {spec.name} b{row['batch']} {precision}: {peer}", flush=True)
        row["peers"][peer] = budget.step(peer, lambda: bench_peer(peer, spec, made, inputs, precision, args))
    ratios(row, rate)
    return row


def bench_batch(spec: Spec, made: Made, path: Path, size: int, batch: int, args, budget: Budget, run: dict,
                emit: Callable[[dict], None]) -> None:
    """The rows of one batch size: FLOPs and torch's fp32 outputs once, then each precision."""
    inputs = spec.inputs(batch, size)
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    flops = guarded("FLOP count", lambda: vars(count_flops(path, shapes)))
    want = guarded("torch fp32 reference", lambda: {"outputs": reference(made, inputs, args.device)})
    for precision in args.precisions:
        row = _row(spec, batch, precision, size, run) | {
            "input_shapes": {k: list(v) for k, v in shapes.items()}, "flops": flops.get("flops"),
            "flops_by_op": flops.get("by_op"), "flops_uncounted": flops.get("uncounted"),
            "flops_error": flops.get("error")}
        if budget.spent("kiln"):
            emit(row | {"skipped": "budget spent"})
        elif "error" in want:
            emit(row | {"error": f"torch fp32 reference failed: {want['error']}"})
        else:
            rate = run["matmul_flops_per_s"].get(precision)
            emit(bench_row(spec, made, path, inputs, want["outputs"], precision, args, budget, row, rate))


def _row(spec: Spec, batch: int, precision: str, size: int, run: dict) -> dict:
    return {"model": spec.name, "batch": batch, "precision": precision, "size": size, "run": run["started"]}


def bench_model(spec: Spec, args, budget: Budget, results: dict, emit: Callable[[dict], None]) -> None:
    """Every batch × precision row of one model, each emitted (and written) as soon as it is done."""
    size = (args.image_size if spec.task == "image" else args.seq_len) or spec.default_size
    run = results["runs"][-1]
    rows = [(b, p) for b in args.batches for p in args.precisions]
    if budget.spent():
        for b, p in rows:
            emit(_row(spec, b, p, size, run) | {"skipped": "budget spent"})
        return
    print(f"[{budget.elapsed:6.1f} s] {spec.name}: model and ONNX export", flush=True)
    start = time.perf_counter()
    try:
        made = instantiate(spec, size)
        path, cached = onnx_file(spec, made, size, args.cache)
    except Exception as e:  # the model's rows all record why
        traceback.print_exc()
        for b, p in rows:
            emit(_row(spec, b, p, size, run) | {"error": f"model or export failed: {_error(e)}"})
        return
    results["models"][spec.name] = {"source": made.source, "fallback": made.fallback, "size": size,
                                    "onnx": path.name, "onnx_cached": cached,
                                    "export_seconds": time.perf_counter() - start}
    for batch in args.batches:
        bench_batch(spec, made, path, size, batch, args, budget, run, emit)


def versions() -> dict:
    v = {"kiln": kiln.__version__, "torch": torch.__version__, "cuda": torch.version.cuda, "onnx": onnx.__version__,
         "python": platform.python_version()}
    for name in ("triton", "torchvision", "transformers"):
        try:
            v[name] = importlib.import_module(name).__version__
        except ImportError:
            v[name] = None
    return v


def device_info(backend: str) -> dict:
    """The device a results file is for: backend, name, and the slug its file name carries."""
    device = detect(backend)
    slug = re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-")
    return {"backend": device.backend, "name": device.name,
            "slug": slug if device.backend == "cuda" else f"cpu-{slug}"}


def new_results(args, argv: list[str]) -> dict:
    now = datetime.now(timezone.utc)
    run = {"started": now.isoformat(timespec="seconds"), "argv": argv, "budget_seconds": args.budget_seconds,
           "settings": {**TIMING[args.quick], "cudnn_benchmark": True, "peer_setup": "model and float inputs cast "
                        "to the precision; CNNs channels_last; torch.no_grad; fresh torch.compile per row"},
           "matmul_flops_per_s": {}, "budget_exhausted": False, "skipped_rows": 0,
           "skipped_peers": 0}
    return {"device": device_info(args.device), "date": now.date().isoformat(), "versions": versions(),
            "runs": [run], "models": {}, "rows": []}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    budget = Budget(args.budget_seconds)
    torch.backends.cudnn.benchmark = True  # for every engine and peer alike: fixed shapes, tuned convolutions
    results = new_results(args, argv)
    run = results["runs"][-1]
    for precision in [p for p in args.precisions if p in DTYPES]:
        rate = guarded("matmul probe", lambda: {"rate": matmul_rate(args.device, precision, args.quick)})
        if "rate" in rate:
            run["matmul_flops_per_s"][precision] = rate["rate"]

    def emit(row: dict) -> None:
        run["skipped_rows"] += bool(row.get("skipped"))
        run["skipped_peers"] += sum(bool(m.get("skipped")) for m in row.get("peers", {}).values())
        run["budget_exhausted"] = budget.exhausted
        run["seconds"] = budget.elapsed
        results["rows"].append(row)
        report.write(results, args.out)

    for name in args.models:
        bench_model(SPECS[name], args, budget, results, emit)
    json_path, md_path = report.write(results, args.out)
    print(f"[{budget.elapsed:6.1f} s] wrote {json_path} and {md_path}", flush=True)
    return results


if __name__ == "__main__":
    main()
