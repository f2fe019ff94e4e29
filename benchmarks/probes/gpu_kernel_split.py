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

import kiln
from benchmarks.peers import prepare, runner
from benchmarks.probes.harness import event_ms, model_rows, profiled, rows_parser, suite_row

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
    prof = profiled(fn, ITERS)
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
    spec, made, path, inputs, feeds = suite_row(name, batch, cache)
    config = kiln.BuildConfig.with_shapes({k: tuple(v.shape) for k, v in feeds.items()}, device="cuda", fp16=True,
                                          timing_cache=str(cache / "split-timing.db"))
    start = time.perf_counter()
    engine = kiln.build(path, config)
    out = {"model": name, "batch": batch, "build_s": time.perf_counter() - start}
    ctx = engine.create_context()
    out["kiln"] = split(lambda: ctx.run(feeds)) | {"event_ms": event_ms(lambda: ctx.run(feeds), iters=50, warmup=5)}
    for peer, call in torch_peers(spec, made, inputs).items():
        out[peer] = split(call) | {"event_ms": event_ms(call, iters=50, warmup=5)}
    return out


def torch_peers(spec, made, inputs: dict) -> dict:
    """Eager and reduce-overhead fp16 calls of the suite model on `inputs` (CNNs channels_last), each run thrice."""
    model, args = prepare(made.module, inputs, "fp16", "cuda", spec.channels_last)
    calls = {peer: runner(peer, model, args)[0] for peer in ("eager", "reduce-overhead")}
    for call in calls.values():
        for _ in range(3):
            call()
    return calls


def main() -> None:
    args = rows_parser(__doc__, "vit_b_16:64,bert:64,mobilenet_v2:64", 400).parse_args()
    rows = model_rows(args, row, args.out / "kernel-split.json")
    for r in rows:
        print(f"\n{r['model']} b{r['batch']} (kiln build {r['build_s']:.1f} s)")
        for who in ("kiln", "eager", "reduce-overhead"):
            d = r[who]
            cats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(d["by_category"].items(), key=lambda kv: -kv[1]))
            print(f"  {who:16s} event {d['event_ms']:.3f} ms, kernels {d['kernel_ms']:.3f} ms: {cats}")
            for t in d["top"][:6]:
                print(f"      {t['ms']:.3f} {t['category']:9s} {t['kernel'][:110]}")


if __name__ == "__main__":
    main()
