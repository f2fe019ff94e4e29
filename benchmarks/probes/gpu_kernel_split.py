"""Kernel time by category, kiln's engine beside torch eager and reduce-overhead on the same row (torch.profiler):
which part of a b64 row (GEMM, attention, the rest) keeps kiln near 1.0× the best torch mode.

    python -m benchmarks.probes.gpu_kernel_split --out DIR [--rows vit_b_16:64,bert:64,mobilenet_v2:64]

Writes DIR/kernel-split.json; prints per row and contender the ms per call by category and the top kernels.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import kiln
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.peers import prepare, runner
from benchmarks.probes.harness import event_ms, parser, write_json

CATEGORIES = (("attention", r"flash|fmha|attention|_attn|sdpa"),
              ("gemm", r"gemm|cutlass|xmma|nvjet|sm90|wgmma|matmul|_mm_|cublas"),
              ("conv", r"conv|implicit|winograd|dgrad|fprop"),
              ("norm", r"layer_norm|layernorm|_ln_|norm"),
              ("copy", r"copy|transpose|cat|permute|elementwise_kernel.*direct_copy"))
ITERS = 10


def category(name: str) -> str:
    low = name.lower()
    return next((c for c, pat in CATEGORIES if re.search(pat, low)), "other")


def split(fn) -> dict:
    """CUDA kernel time per call of `fn`, by category, and its ten longest kernels."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name] += e.device_time_total / 1000 / ITERS
    by_cat: dict[str, float] = defaultdict(float)
    for name, ms in per_kernel.items():
        by_cat[category(name)] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:10]
    return {"kernel_ms": sum(per_kernel.values()), "by_category": dict(by_cat),
            "top": [{"kernel": k[:140], "ms": round(v, 4), "category": category(k)} for k, v in top]}


def row(name: str, batch: int, cache: Path) -> dict:
    spec = SPECS[name]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, cache)
    inputs = spec.inputs(batch, spec.default_size)
    feeds = {k: v.cuda() for k, v in inputs.items()}
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / "split-timing.db"))
    start = time.perf_counter()
    engine = kiln.build(path, config)
    out = {"model": name, "batch": batch, "build_s": time.perf_counter() - start}
    ctx = engine.create_context()
    out["kiln"] = split(lambda: ctx.run(feeds)) | {"event_ms": event_ms(lambda: ctx.run(feeds), iters=50, warmup=5)}
    model, args = prepare(made.module, inputs, "fp16", "cuda", spec.channels_last)
    for peer in ("eager", "reduce-overhead"):
        call, _ = runner(peer, model, args)
        for _ in range(3):
            call()
        out[peer] = split(call) | {"event_ms": event_ms(call, iters=50, warmup=5)}
    return out


def main() -> None:
    ap = parser(__doc__, required=True, out_help="folder for kernel-split.json")
    ap.add_argument("--rows", default="vit_b_16:64,bert:64,mobilenet_v2:64")
    ap.add_argument("--cache", type=Path, default=Path(".kiln-cache/benchmarks"))
    ap.add_argument("--budget-seconds", type=float, default=400)
    args = ap.parse_args()
    start, rows = time.perf_counter(), []
    for item in args.rows.split(","):
        if time.perf_counter() - start > args.budget_seconds:
            rows.append({"row": item, "skipped": "over the time budget"})
            continue
        name, batch = item.split(":")
        try:
            rows.append(row(name, int(batch), args.cache))
        except Exception as e:  # noqa: BLE001 - a probe reports, it does not stop
            rows.append({"row": item, "error": f"{type(e).__name__}: {e}"[:500]})
        write_json(args.out / "kernel-split.json", {"rows": rows})
    for r in rows:
        if "kiln" not in r:
            print(r)
            continue
        print(f"\n{r['model']} b{r['batch']} (kiln build {r['build_s']:.1f} s)")
        for who in ("kiln", "eager", "reduce-overhead"):
            d = r[who]
            cats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(d["by_category"].items(), key=lambda kv: -kv[1]))
            print(f"  {who:16s} event {d['event_ms']:.3f} ms, kernels {d['kernel_ms']:.3f} ms: {cats}")
            for t in d["top"][:6]:
                print(f"      {t['ms']:.3f} {t['category']:9s} {t['kernel'][:110]}")


if __name__ == "__main__":
    main()
