"""What every GPU probe shares: the `--out` argument, the facts a result file records (device, date, versions), the
timing loops, and writing the JSON.

Probes are modules of the `benchmarks.probes` package, run from the repository root with kiln importable (installed
with `pip install -e .`, or `PYTHONPATH=src`):

    python -m benchmarks.probes.gpu_wgmma_probe --out probe.json

Run that way, the repository root is on `sys.path`, so a probe imports kiln by its public modules, the benchmark
suite as `benchmarks.*` and the test models as `tests.models.*` (`from tests.models.vision import ResNet50`); no
probe edits `sys.path`.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import kiln
from kiln.util.timing import device_time_us, measure

ROOT = Path(__file__).resolve().parents[2]
# Shared memory a Hopper program may use (227 KiB of the SM's 228): what the kernels' config lists are filtered by.
SMEM = 227 * 1024
# ResNet-50 b64's 3x3 convs, stride 1, pad 1: (label, N, C, HW, CO)
CONVS3 = [("r50 l1 3x3 64", 64, 64, 56, 64), ("r50 l2 3x3 128", 64, 128, 28, 128), ("r50 l3 3x3 256", 64, 256, 14, 256),
          ("r50 l4 3x3 512", 64, 512, 7, 512)]


def parser(doc: str | None, *, out: str | None = None, required: bool = False,
           out_help: str = "where the results go") -> argparse.ArgumentParser:
    """An argument parser described by the probe's docstring, with `--out` (a Path; `out` is its default)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(out) if out else None, required=required, help=out_help)
    return ap


def facts(device: str = "cuda") -> dict:
    """What a result file must say to be read later: the device, the date, and the versions that shaped the numbers."""
    info: dict = {"date": str(date.today()), "kiln": kiln.__version__, "torch": torch.__version__}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info |= {"device": p.name, "compute_capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
                 "memory_bytes": p.total_memory, "cuda": torch.version.cuda}
    else:
        info["device"] = "cpu"
    return info


def banner(device: str = "cuda") -> dict:
    """Print the facts on one line (the first line of every probe's log) and return them."""
    f = facts(device)
    print(" ".join(f"{k} {v}" for k, v in f.items() if k in ("device", "torch", "triton", "kiln")), flush=True)
    return f


def write_json(path: Path | str, data: dict, *, device: str = "cuda") -> Path:
    """Write `data` as indented JSON to `path` (parents created), after the facts (keys in `data` win)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(facts(device) | data, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def once_ms(fn: Callable[[], object]) -> float:
    """Host ms of one synchronized fn() call (a first call, say), the device idle before it."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def graph_ms(fn: Callable[[], object], repeat: int = 10) -> float:
    """Device time of one fn() call: `repeat` calls captured in one CUDA graph, replays timed (no host overhead, as in
    a kiln engine)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            fn()
    return measure(graph.replay, device="cuda", warmup=3, iterations=20).median / repeat


def best(fns: list[tuple[str, Callable[[], object]]]) -> tuple[float, str, int]:
    """The fastest of labelled candidates by `graph_ms`: (ms, label, how many ran); \
one that fails is printed, skipped."""
    out = []
    for label, fn in fns:
        try:
            out.append((graph_ms(fn), label))
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is skipped
            print(f"    {label}: {type(e).__name__}: {str(e)[:160]}", flush=True)
    t, label = min(out) if out else (float("inf"), "none ran")
    return t, label, len(out)


def event_ms(fn: Callable[[], object], iters: int = 50, warmup: int = 10) -> float:
    """Median of CUDA events around each call (host launch gaps included: what a caller of `fn` sees)."""
    return measure(fn, device="cuda", warmup=warmup, iterations=iters).median


def alternating_ms(fns: dict[str, Callable[[], object]], rounds: int, iters: int = 100) -> dict[str, list[float]]:
    """Each round, `event_ms` of every fn in turn: per fn, its round medians (the machine's drift shared by all)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(event_ms(fn, iters=iters, warmup=10))
    return times


def wall_ms(fn: Callable[[], object], iters: int = 100, warmup: int = 10) -> float:
    """Median host time of call + synchronize, on any device."""
    for _ in range(warmup):
        fn()
    return float(np.median(calls_ms(fn, iters)))


def calls_ms(fn: Callable[[], object], n: int) -> list[float]:
    """Host ms of each of `n` calls of fn, each synchronized before and after."""
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def autotuner_us(fn: Callable[[], object], repeats: int = 20) -> float:
    """Median µs of `fn()` timed as the autotuner times a candidate (`kiln.util.timing.device_time_us`: CUDA events
    queued behind a GPU spin, garbage collector paused), so the host's launch cost is not counted while it is shorter
    than the spin."""
    return device_time_us(lambda _: fn(), None, repeats)


def profiled(fn: Callable[[], object], calls: int, warmup: int = 1, cpu: bool = False):
    """torch.profiler over `calls` synchronized calls of `fn` after `warmup` untraced ones (CUDA activities, and the
    CPU's with `cpu`); returns the finished profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if cpu else [])) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof


def cosine(a, b) -> float:
    """Cosine similarity of two arrays or tensors, in float64."""
    a, b = (np.asarray(t.detach().double().cpu() if isinstance(t, torch.Tensor) else t, dtype=np.float64).ravel()
            for t in (a, b))
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


class Budget:
    """Seconds left for a probe that must finish inside a device call's limit."""

    def __init__(self, seconds: float):
        self.start, self.seconds = time.perf_counter(), seconds

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def left(self) -> float:
        return self.seconds - self.elapsed

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed:6.1f} s] {msg}", flush=True)


def rows_parser(doc: str | None, rows: str, budget_seconds: float) -> argparse.ArgumentParser:
    """The arguments of a probe over suite rows: --out (a folder), --rows "model[@size]:batch,...", --cache, and
    --budget-seconds (after which the remaining rows are skipped)."""
    ap = parser(doc, required=True, out_help="folder for the probe's JSON")
    ap.add_argument("--rows", default=rows)
    ap.add_argument("--cache", type=Path, default=Path(".kiln-cache/benchmarks"))
    ap.add_argument("--budget-seconds", type=float, default=budget_seconds)
    return ap


def model_rows(args, fn: Callable[[str, int, Path], dict], out: Path) -> list[dict]:
    """For each "model:batch" of `args.rows`: `fn(model, batch, args.cache)`, skipped once `args.budget_seconds`
    have passed, an exception recorded as the row's "error"; all rows rewritten to `out` after each. Prints the
    rows that failed or were skipped and returns the measured ones."""
    start, rows = time.perf_counter(), []
    for item in args.rows.split(","):
        if time.perf_counter() - start > args.budget_seconds:
            rows.append({"row": item, "skipped": "over the time budget"})
            continue
        name, batch = item.split(":")
        try:
            rows.append(fn(name, int(batch), args.cache))
        except Exception as e:  # noqa: BLE001 - a probe reports, it does not stop
            rows.append({"row": item, "error": f"{type(e).__name__}: {e}"[:800]})
        write_json(out, {"rows": rows})
    for r in rows:
        if "error" in r or "skipped" in r:
            print(r)
    return [r for r in rows if "error" not in r and "skipped" not in r]


def suite_row(name: str, batch: int, cache: Path):
    """(spec, made, onnx path, CPU inputs, CUDA feeds) of the suite model `name` at `batch`: at its default size,
    or at SIZE (sequence or image side) when `name` is "model@SIZE"."""
    from benchmarks.models import SPECS, instantiate, onnx_file

    name, _, size = name.partition("@")
    spec = SPECS[name]
    size = int(size) if size else spec.default_size
    made = instantiate(spec, size)
    path, _ = onnx_file(spec, made, size, cache)
    inputs = spec.inputs(batch, size)
    return spec, made, path, inputs, {k: v.cuda() for k, v in inputs.items()}
