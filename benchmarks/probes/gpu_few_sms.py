"""Probe (issue 27 target 6, user story 5 "too small to tune"): kiln and the torch modes on a slice of the GPU, a
CUDA green context of --sms SMs (torch.cuda.green_contexts), against the same suite on the whole GPU.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_few_sms --sms 40 --out DIR -- --models resnet50,minilm \
        --batches 1,16 --peers eager,default,reduce-overhead,max-autotune --max-autotune resnet50,minilm

Everything after `--` goes to `python -m benchmarks.suite`. The suite runs twice, each in its own process: inside
the green context (made current before any CUDA work but the primary context's start, so every stream, handle and
kernel kiln and torch make afterwards belongs to it) and on the whole GPU. An fp16 8192² matmul timed in each
process shows the slice took (expect about SMs ÷ --sms slower inside). torch builds that only have the stream form of
green contexts (`GreenContext.Stream()`) run the suite on that stream: streams kiln or torch create themselves then
run on every SM, which the JSON says ("how"). Writes DIR/sms-N/ and DIR/sms-all/ (the suite's files) and
DIR/few-sms.json / .md: per row kiln's and the best torch mode's ms in both, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def enter_green_context(sms: int) -> dict:
    """Make a green context of `sms` SMs current for this process's CUDA work; what was done (or why not)."""
    import torch

    try:
        from torch.cuda import green_contexts
    except ImportError as e:
        return {"green_context": False, "why": f"torch {torch.__version__} has no torch.cuda.green_contexts: {e}"}
    torch.zeros(1, device="cuda")  # the primary context first (the green context is carved from it)
    try:
        try:
            ctx = green_contexts.GreenContext.create(num_sms=sms, device_id=torch.cuda.current_device())
        except TypeError:  # the first API: create(num_sms, device_id)
            ctx = green_contexts.GreenContext.create(sms, torch.cuda.current_device())
        if hasattr(ctx, "set_context"):
            ctx.set_context()
            how = "set_context: every stream made afterwards belongs to the green context"
        else:
            torch.cuda.set_stream(ctx.Stream())
            how = "Stream(): only the current stream is the green context's; streams made later use every SM"
    except Exception as e:  # noqa: BLE001 - recorded: the driver or the card may refuse
        return {"green_context": False, "why": f"{type(e).__name__}: {e}"}
    enter_green_context.keep = ctx  # the context must outlive the run
    return {"green_context": True, "sms": sms, "how": how}


def matmul_ms() -> float:
    """Median ms of an fp16 8192² matmul on the current stream (CUDA events, 20 after 5 warm-up)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    times = []
    for i in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ a
        end.record()
        end.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def inner(sms: int, out: Path, suite_args: list[str]) -> None:
    """One process: the green context (sms > 0), the matmul check, then the suite into `out`."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        facts = {"green_context": False, "why": "no CUDA device visible"}
        (out / "green-context.json").write_text(json.dumps(facts, indent=1) + "\n")
        print(json.dumps(facts), flush=True)
        return
    facts = enter_green_context(sms) if sms else {"green_context": False, "why": "the whole GPU"}

    facts |= {"device_sms": torch.cuda.get_device_properties(0).multi_processor_count, "matmul_ms": matmul_ms()}
    (out / "green-context.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(json.dumps(facts), flush=True)
    if sms and not facts["green_context"]:
        return
    from benchmarks import suite

    suite.main([*suite_args, "--out", str(out)])


def _rows(folder: Path) -> dict:
    """(model, batch, precision) → (kiln ms, best peer, its ms) from the suite's JSON in `folder`."""
    out = {}
    for path in folder.glob("*.json"):
        if path.name == "green-context.json":
            continue
        for r in json.loads(path.read_text()).get("rows", []):
            kiln = (r.get("kiln") or {}).get("median_ms")
            peer = r.get("best_peer")
            peer_ms = ((r.get("peers") or {}).get(peer) or {}).get("median_ms") if peer else None
            out[(r["model"], r["batch"], r["precision"])] = (kiln, peer, peer_ms)
    return out


def own_cache(suite_args: list[str], default: Path, label: str) -> list[str]:
    """The suite's arguments with a timing cache of the run's own (a given --cache gets a subfolder per run): a green
    context reports every SM, so a shared cache would hand the slice's choices to the whole-GPU run."""
    if "--cache" not in suite_args:
        return [*suite_args, "--cache", str(default)]
    i = suite_args.index("--cache") + 1
    return [*suite_args[:i], str(Path(suite_args[i]) / label), *suite_args[i + 1:]]


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=40, help="SMs of the green context")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--inner-sms", type=int, default=None, help=argparse.SUPPRESS)  # the child processes' mode
    args, suite_args = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if args.inner_sms is not None:
        inner(args.inner_sms, args.out, suite_args)
        return
    started, runs = time.time(), {}
    for label, sms in ((f"sms-{args.sms}", args.sms), ("sms-all", 0)):
        folder = args.out / label
        done = subprocess.run([sys.executable, "-m", "benchmarks.probes.gpu_few_sms", "--inner-sms", str(sms),
                               "--out", str(folder), "--", *own_cache(suite_args, folder / "cache", label)])
        facts_path = folder / "green-context.json"
        runs[label] = {"exit": done.returncode,
                       "facts": json.loads(facts_path.read_text()) if facts_path.exists() else None,
                       "rows": _rows(folder) if folder.exists() else {}}
    small, whole = runs[f"sms-{args.sms}"], runs["sms-all"]
    lines = [f"# kiln and torch on {args.sms} SMs (green context) and on the whole GPU", "",
             f"green context: {small['facts']}", f"whole GPU: {whole['facts']}", "",
             "| model | batch | precision | kiln ms (slice) | best torch (slice) | × | kiln ms (whole) | "
             "best torch (whole) | × |", "|---|---|---|---|---|---|---|---|---|"]
    fmt = (lambda v: "-" if v is None else f"{v:.3f}")  # noqa: E731
    rows = []
    for key in sorted(set(small["rows"]) | set(whole["rows"])):
        a, b = small["rows"].get(key, (None, None, None)), whole["rows"].get(key, (None, None, None))
        ratio = lambda r: r[2] / r[0] if r[0] and r[2] else None  # noqa: E731
        rows.append({"model": key[0], "batch": key[1], "precision": key[2], "slice": a, "whole": b,
                     "ratio_slice": ratio(a), "ratio_whole": ratio(b)})
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {fmt(a[0])} | {a[1]} {fmt(a[2])} | {fmt(ratio(a))} | "
                     f"{fmt(b[0])} | {b[1]} {fmt(b[2])} | {fmt(ratio(b))} |")
    summary = {"sms": args.sms, "suite_args": suite_args, "seconds": round(time.time() - started, 1),
               "slice": {k: v for k, v in small.items() if k != "rows"},
               "whole": {k: v for k, v in whole.items() if k != "rows"}, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "few-sms.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (args.out / "few-sms.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
