"""Results files: <device>-<date>.json (everything) and .md (the table), and merging the files of split runs.

`python -m benchmarks.report A.json B.json --out DIR` merges runs split by model (rows of later files win).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.peers import PEERS

Results = dict


def row_key(row: dict) -> tuple:
    return row["model"], row["batch"], row["precision"]


def merge(parts: list[Results]) -> Results:
    """One results document from several of one device: rows keyed by model × batch × precision, later wins."""
    devices = {p["device"]["slug"] for p in parts}
    if len(devices) > 1:
        raise SystemExit(f"results of different devices cannot be merged: {sorted(devices)}")
    out = dict(parts[-1])
    rows: dict[tuple, dict] = {}
    for r in (r for p in parts for r in p["rows"]):  # a row skipped for time keeps an earlier measurement
        if not (r.get("skipped") and row_key(r) in rows):
            rows[row_key(r)] = r
    out["rows"] = sorted(rows.values(), key=row_key)
    out["runs"] = list({run["started"]: run for p in parts for run in p["runs"]}.values())
    out["models"] = {k: v for p in parts for k, v in p["models"].items()}
    return out


def paths(results: Results, folder: Path) -> tuple[Path, Path]:
    stem = f"{results['device']['slug']}-{results['date']}"
    return folder / f"{stem}.json", folder / f"{stem}.md"


def write(results: Results, folder: Path) -> tuple[Path, Path]:
    """Write the JSON and the Markdown, merged with an earlier file of the same device and date in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = paths(results, folder)
    if json_path.is_file():
        results = merge([json.loads(json_path.read_text()), results])
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    md_path.write_text(render(results))
    return json_path, md_path


def _figure(m: dict | None, batch: int, notes: list[str], compiled: bool = False) -> str:
    """A latency (batch 1) or throughput (larger batches) cell, with torch.compile's compile seconds; an error
    becomes a numbered note."""
    if not m:
        return "–"
    if m.get("skipped"):
        return f"skipped ({m['skipped']})"
    if m.get("error"):
        notes.append(m["error"])
        return f"error [{len(notes)}]"
    figure = f"{m['median_ms']:.3f} ms" if batch == 1 else f"{m['items_per_s']:,.0f}/s"
    return f"{figure} ({m['first_call_seconds']:.0f} s to compile)" if compiled else figure


def _ratio(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}×"


def _accuracy(kiln: dict) -> str:
    acc = kiln.get("accuracy") or {}
    if not acc:
        return "–"
    return f"{min(a['cosine'] for a in acc.values()):.5f} / {max(a['max_rel_err'] for a in acc.values()):.1e}"


def _table(results: Results, notes: list[str]) -> list[str]:
    head = ["model", "batch", "prec", *PEERS, "kiln", "kiln ÷ best peer", "floor", "kiln of floor",
            "kiln build", "cos / max rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results["rows"]:
        if r.get("skipped") or r.get("error"):
            why = f"skipped: {r['skipped']}" if r.get("skipped") else f"failed: {r['error']}"
            lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | {why} |")
            continue
        peers = r.get("peers", {})
        kiln = r.get("kiln") or {}
        floor = _figure({"median_ms": r["floor_ms"], "items_per_s": r["floor_items_per_s"]}, r["batch"], notes) \
            if r.get("floor_ms") else "–"
        build = f"{kiln['build_seconds']:.1f} s" if kiln.get("build_seconds") is not None else "–"
        cells = [r["model"], str(r["batch"]), r["precision"],
                 *(_figure(peers.get(p), r["batch"], notes, p != "eager") for p in PEERS),
                 _figure(kiln, r["batch"], notes), _ratio(r.get("speedup_vs_best_peer")), floor,
                 _ratio(r.get("kiln_fraction_of_floor"), 3), build, _accuracy(kiln)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _header(results: Results) -> list[str]:
    v, dev = results["versions"], results["device"]
    runs = [f"- run {run['started']}: `{' '.join(run['argv'])}`; matmul probe " + ", ".join(
        f"{p} {x / 1e12:.3g} TFLOP/s" for p, x in run["matmul_flops_per_s"].items()) for run in results["runs"]]
    return [f"# kiln benchmarks: {dev['name']}, {results['date']}", "",
            f"device: {dev['backend']}: {dev['name']}; " + ", ".join(f"{k} {x}" for k, x in v.items()), "",
            *runs, "",
            "Cells: median latency at batch 1, items/s (from the median) at larger batches; CUDA events on a "
            "GPU. `kiln ÷ best peer` is kiln's speed over the fastest peer's in the same row (> 1: kiln is "
            "faster). `floor` is the model's Conv/MatMul/Gemm FLOPs ÷ the matmul probe's rate; `kiln of floor` "
            "is the floor time ÷ kiln's time. Accuracy: kiln against torch fp32 on the same inputs (lowest cosine "
            "similarity / highest max |kiln − torch| ÷ max |torch| over the outputs). int8 / fp8 rows: kiln "
            "quantized (entropy calibration on 32 random inputs other than the measured ones), the peers in fp16 "
            "(torch has no automatic int8).", ""]


def _remarks(results: Results, notes: list[str]) -> list[str]:
    out = []
    for name, m in sorted(results["models"].items()):
        out.append(f"- {name}: {m['source']}" + (f" — **fallback**: {m['fallback']}" if m.get("fallback") else ""))
    lacking: dict[str, list[str]] = {}
    for r in results["rows"]:
        if not (r.get("skipped") or r.get("error")) and "max-autotune" not in r.get("peers", {}):
            lacking.setdefault(r["model"], []).append(f"b{r['batch']} {r['precision']}")
    if lacking:
        out.append("- without max-autotune (opt-in per model with --max-autotune): "
                   + "; ".join(f"{m} ({', '.join(rows)})" for m, rows in lacking.items()))
    for run in results["runs"]:
        if run.get("budget_exhausted"):
            out.append(f"- run of {run['started']}: the budget of {run['budget_seconds']} s ran out; "
                       f"{run['skipped_rows']} row(s) and {run['skipped_peers']} peer measurement(s) skipped")
    for r in results["rows"]:
        phases = (r.get("kiln") or {}).get("build_phases")
        if phases:  # issue 27 target 2: where each build's seconds went, its three largest phases
            top = sorted(phases.items(), key=lambda kv: -kv[1])[:3]
            busy = list(((r.get("kiln") or {}).get("build_check_seconds") or {}).items())[:3]
            out.append(f"- {r['model']} b{r['batch']} {r['precision']} build: "
                       + ", ".join(f"{name} {sec:.1f} s" for name, sec in top)
                       + ("; compile + check by tactic (thread-seconds): "
                          + ", ".join(f"{name} {sec:.1f}" for name, sec in busy) if busy else ""))
    for r in results["rows"]:
        if r.get("flops_uncounted"):
            out.append(f"- {r['model']} b{r['batch']}: FLOPs exclude {len(r['flops_uncounted'])} node(s) with "
                       f"unknown shapes: {', '.join(r['flops_uncounted'][:5])}")
    out += [f"{i}. {n}" for i, n in enumerate(notes, 1)]
    return ["## Notes", "", *out, ""] if out else []


def render(results: Results) -> str:
    """The Markdown report: header with versions and probe rates, one table row per model × batch × precision."""
    notes: list[str] = []
    table = _table(results, notes)
    return "\n".join(_header(results) + table + [""] + _remarks(results, notes))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument("files", nargs="+", type=Path, help="results JSON files of one device, oldest first")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    merged = merge([json.loads(f.read_text()) for f in args.files])
    for path in write(merged, args.out):
        print(path)


if __name__ == "__main__":
    main()
