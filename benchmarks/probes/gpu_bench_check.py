"""On CUDA: does `kiln bench`'s GPU-compute median agree with an independent CUDA-event timing of the same engine?

    python -m benchmarks.probes.gpu_bench_check --out DIR [--batches 1,64] [--budget-seconds 210]

ResNet-50 (tests/models/vision.py, random weights with calibrated BatchNorm, eval mode) is exported to ONNX with a
dynamic batch, built fp16 for each batch size and saved as a plan; the plan is loaded once and timed on device
inputs by kiln.bench.run_bench (what `kiln bench --no-data-transfers` runs) and by this script's own loops:

  per-call      events around each `ctx.run` (median of N), the GPU kept busy by a spin kernel while the host
                enqueues, as kiln bench does: the acceptance reference (within 5 %)
  naive         events around each `ctx.run`, GPU idle between calls (includes the host's launch gap)
  back-to-back  events around N calls issued without waiting, divided by N

Then `kiln bench PLAN --streams 2 --json` and `kiln bench PLAN --dump-profile --json` run as commands; their JSON
is stored in --out. Every stage is guarded: a failure is recorded and the script goes on; the budget skips late
stages rather than overrun. The summary table is printed last; everything is in DIR/gpu_bench_check.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

import kiln
from benchmarks.probes.harness import ROOT, Budget, facts, parser
from kiln.bench.session import BenchOptions, run_bench

TOLERANCE = 0.05


def error_text() -> str:
    return traceback.format_exc()[-2000:]


def export_resnet50(path: Path) -> None:
    from tests.models.export import export
    from tests.models.vision import ResNet50, randomize_bn

    torch.manual_seed(0)
    model = randomize_bn(ResNet50().eval())
    export(model, (torch.randn(2, 3, 224, 224),), path, dynamo=False, input_names=["input"], output_names=["out"],
           dynamic_axes={"input": {0: "batch"}, "out": {0: "batch"}}, opset=18)


def cycles_per_ms() -> float:
    torch.cuda._sleep(1000)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(2_000_000)
    e.record()
    e.synchronize()
    return 2_000_000 / s.elapsed_time(e)


def per_call(ctx, feeds: dict, n: int, prime_cycles: int = 0) -> list[float]:
    """Events around each ctx.run; with prime_cycles, a spin kernel first keeps the GPU busy while the host
    enqueues, so that the events time the GPU's work only."""
    times = []
    stream = torch.cuda.current_stream()
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if prime_cycles:
            torch.cuda._sleep(prime_cycles)
        s.record(stream)
        ctx.run(feeds)
        e.record(stream)
        e.synchronize()
        times.append(s.elapsed_time(e))
    return times


def back_to_back(ctx, feeds: dict, n: int) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        ctx.run(feeds)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n


def host_enqueue_ms(ctx, feeds: dict, n: int = 20) -> float:
    """Median host time of one ctx.run call up to its return (the GPU work it enqueues may still run)."""
    spans = []
    for _ in range(n):
        t0 = time.perf_counter()
        ctx.run(feeds)
        spans.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(spans)


def time_engine(engine, batch: int, iterations: int, row: dict, budget: Budget) -> None:
    """kiln bench's machinery and the independent timings, interleaved over two rounds (clock drift hits both)."""
    name = engine.inputs[0].name
    dtype = engine.inputs[0].dtype
    x_host = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(dtype.numpy)
    x_dev = torch.from_numpy(x_host).cuda()
    feeds_dev = {name: x_dev}
    ctx = engine.create_context()
    for _ in range(20):
        ctx.run(feeds_dev)
    torch.cuda.synchronize()
    enqueue = host_enqueue_ms(ctx, feeds_dev)
    cpm = cycles_per_ms()
    prime = int(1.5 * enqueue * cpm)
    row.update(host_enqueue_ms=enqueue, prime_cycles=prime, cycles_per_ms=cpm)
    bench_compute, bench_gpu, primed, naive, b2b = [], [], [], [], []
    bench_json = None
    for rnd in range(2):
        result = run_bench(engine, {name: x_host}, BenchOptions(iterations=iterations, warmup=20,
                                                                data_transfers=False), batch=batch)
        bench_compute += result.series("compute")
        bench_gpu += result.series("gpu")
        bench_json = result.to_json()
        primed += per_call(ctx, feeds_dev, iterations, prime)
        naive += per_call(ctx, feeds_dev, iterations)
        b2b.append(back_to_back(ctx, feeds_dev, iterations))
        budget.log(f"batch {batch} round {rnd + 1}: bench compute median {np.median(bench_compute):.4f} ms, "
                    f"per-call {np.median(primed):.4f} ms, naive {np.median(naive):.4f} ms, "
                    f"back-to-back {np.mean(b2b):.4f} ms")
    med = lambda v: float(np.median(v))  # noqa: E731
    row.update(bench_compute_median_ms=med(bench_compute), bench_gpu_median_ms=med(bench_gpu),
               independent_per_call_median_ms=med(primed), independent_naive_median_ms=med(naive),
               independent_back_to_back_ms=float(np.mean(b2b)), samples_each=len(primed),
               bench_no_transfers=bench_json)
    row["ratio_vs_per_call"] = row["bench_compute_median_ms"] / row["independent_per_call_median_ms"]
    row["ratio_vs_naive"] = row["bench_compute_median_ms"] / row["independent_naive_median_ms"]
    row["ratio_vs_back_to_back"] = row["bench_compute_median_ms"] / row["independent_back_to_back_ms"]
    row["pass"] = abs(row["ratio_vs_per_call"] - 1) <= TOLERANCE
    # the default run (numpy in, numpy out): transfers split into H2D / D2H
    with_transfers = run_bench(engine, {name: x_host}, BenchOptions(iterations=min(iterations, 100), warmup=10),
                               batch=batch)
    row["bench_with_transfers"] = with_transfers.to_json()


def run_cli(args: list[str], out_file: Path, budget: Budget, row: dict, key: str) -> None:
    """`kiln ARGS` in a fresh process; its JSON stdout into out_file."""
    timeout = max(10.0, min(150.0, budget.left - 5))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-c", "from kiln.cli.app import main; main()", *args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        row[key] = {"error": f"timed out after {timeout:.0f} s", "command": "kiln " + " ".join(args)}
        return
    entry = {"command": "kiln " + " ".join(args), "exit_code": proc.returncode,
             "seconds": round(time.perf_counter() - t0, 1)}
    if proc.returncode == 0:
        out_file.write_text(proc.stdout)
        data = json.loads(proc.stdout)
        entry.update(file=str(out_file), queries_per_s=data["throughput"]["queries_per_s"],
                     items_per_s=data["throughput"]["items_per_s"], warnings=data.get("warnings"))
        if "profile" in data:
            entry["profile_top5"] = [(r["layer"], r["kind"], round(r["mean_ms"], 4), round(r["percent"], 1))
                                     for r in data["profile"]["layers"][:5]]
            entry["profile_total_ms"] = data["profile"]["total_ms"]
    else:
        entry["stderr"] = proc.stderr[-2000:]
    row[key] = entry


def main() -> int:
    ap = parser(__doc__, out="/tmp/kiln-bench-check")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--budget-seconds", type=float, default=210.0)
    args = ap.parse_args()
    budget = Budget(args.budget_seconds)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    report: dict = facts() | {"tolerance": TOLERANCE, "batches": []}
    report_path = out / "gpu_bench_check.json"

    def save() -> None:
        report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")

    if not torch.cuda.is_available():
        report["error"] = "no CUDA device visible"
        save()
        print("no CUDA device visible: this check needs a GPU", flush=True)
        return 2
    budget.log(f"device {report['device']}, torch {torch.__version__}")
    onnx_path = out / "resnet50.onnx"
    try:
        export_resnet50(onnx_path)
        budget.log(f"exported {onnx_path}")
    except Exception:
        report["error"] = "export failed: " + error_text()
        save()
        print(report["error"], flush=True)
        return 1
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    for k, batch in enumerate(batches):
        row: dict = {"batch": batch}
        report["batches"].append(row)
        if k > 0 and budget.left < 0.55 * budget.seconds:
            row["skipped"] = f"budget: {budget.elapsed:.0f} s of {budget.seconds:.0f} s used"
            budget.log(f"batch {batch}: skipped ({row['skipped']})")
            save()
            continue
        plan = out / f"resnet50-b{batch}-fp16.plan"
        try:
            t0 = time.perf_counter()
            config = kiln.BuildConfig.with_shapes({"input": (batch, 3, 224, 224)}, fp16=True, device="cuda",
                                                  timing_cache=str(out / "timing.db"))
            kiln.build(onnx_path, config).save(plan)
            row["build_s"] = round(time.perf_counter() - t0, 1)
            budget.log(f"batch {batch}: built and saved {plan.name} in {row['build_s']} s")
            engine = kiln.load(plan)
            row["tactics"] = engine.tactic_summary()
            time_engine(engine, batch, args.iterations, row, budget)
            del engine
            torch.cuda.empty_cache()
        except Exception:
            row["error"] = error_text()
            budget.log(f"batch {batch}: failed\n{row['error']}")
        save()
        if plan.is_file() and budget.left > 30:
            run_cli(["bench", str(plan), "--streams", "2", "--iterations", str(args.iterations), "--json"],
                    out / f"bench-streams2-b{batch}.json", budget, row, "cli_streams2")
            budget.log(f"batch {batch}: kiln bench --streams 2: {_short(row['cli_streams2'])}")
            save()
        if plan.is_file() and budget.left > 30:
            run_cli(["bench", str(plan), "--iterations", "100", "--dump-profile", "--json"],
                    out / f"bench-profile-b{batch}.json", budget, row, "cli_dump_profile")
            budget.log(f"batch {batch}: kiln bench --dump-profile: {_short(row['cli_dump_profile'])}")
            save()
    report["elapsed_s"] = round(budget.elapsed, 1)
    save()
    print_summary(report)
    print(f"JSON: {report_path}", flush=True)
    return 0 if all(r.get("pass") for r in report["batches"] if "skipped" not in r) else 1


def _short(entry: dict) -> str:
    if "error" in entry or entry.get("exit_code"):
        return f"FAILED ({entry.get('error') or entry.get('stderr', '')[-300:]})"
    return f"{entry['queries_per_s']:,.1f} queries/s, {entry['items_per_s']:,.1f} items/s"


def print_summary(report: dict) -> None:
    print(f"\n== kiln bench vs independent CUDA-event timing, ResNet-50 fp16 on {report.get('device')} "
          f"(acceptance: within {100 * TOLERANCE:.0f} % of per-call) ==")
    head = ("batch", "bench compute", "per-call", "ratio", "verdict", "naive", "b2b", "streams=2 q/s",
            "profile total")
    print(" | ".join(f"{h:>13}" for h in head))
    for r in report["batches"]:
        if "skipped" in r or "error" in r:
            print(f"{r['batch']:>13} | {('skipped: ' + r['skipped']) if 'skipped' in r else 'ERROR (see JSON)'}")
            continue
        s2 = r.get("cli_streams2", {})
        prof = r.get("cli_dump_profile", {})
        cells = (r["batch"], f"{r['bench_compute_median_ms']:.4f} ms", f"{r['independent_per_call_median_ms']:.4f} ms",
                 f"{r['ratio_vs_per_call']:.3f}", "PASS" if r["pass"] else "FAIL",
                 f"{r['independent_naive_median_ms']:.4f} ms", f"{r['independent_back_to_back_ms']:.4f} ms",
                 f"{s2['queries_per_s']:,.0f}" if "queries_per_s" in s2 else "failed",
                 f"{prof['profile_total_ms']:.3f} ms" if "profile_total_ms" in prof else "failed")
        print(" | ".join(f"{str(c):>13}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
