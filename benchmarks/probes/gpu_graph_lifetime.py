"""Does a dynamic engine's CUDA graph for a shape still replay correctly after other work ran (a static engine's build
and calls, torch eager and reduce-overhead, empty_cache, garbage in freed memory)? benchmarks.dynamic's interleaved
timing hit "unspecified launch failure" on BERT-base 16x256 in that order (2026-11-28). Each step is synchronized,
so the first failing step is the one printed; replayed outputs are compared with the first call's.

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_graph_lifetime --shapes 1x16,4x64,8x128,16x256 [--no-peers]
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import torch

import kiln
from benchmarks.dynamic import profile
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.peers import cast_inputs, prepare
from benchmarks.suite import CACHE

START = time.perf_counter()


def step(what: str, fn):
    """fn() then a device synchronize; prints the step and its seconds, raises with the step named on failure."""
    t = time.perf_counter()
    try:
        out = fn()
        torch.cuda.synchronize()
    except Exception as e:
        print(f"[{time.perf_counter() - START:6.1f} s] FAILED at {what}: {type(e).__name__}: {e}".splitlines()[0],
              flush=True)
        raise
    print(f"[{time.perf_counter() - START:6.1f} s] ok {what} ({time.perf_counter() - t:.2f} s)", flush=True)
    return out


def same(a: dict, b: dict) -> float:
    """Largest absolute difference between two output dicts' tensors."""
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a if isinstance(a[k], torch.Tensor))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bert")
    p.add_argument("--shapes", default="1x16,4x64,8x128,16x256")
    p.add_argument("--no-peers", action="store_true")
    args = p.parse_args()
    spec = SPECS[args.model]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, Path(CACHE), dynamic_seq=True)
    config = dict(fp16=True, timing_cache=f"{CACHE}/timing-cache.sqlite")
    engine = step("dynamic build", lambda: kiln.build(path, kiln.BuildConfig(profiles=(profile(spec),), **config)))
    ctx = engine.create_context()
    module = None if args.no_peers else prepare(made.module, {}, "fp16", "cuda", spec.channels_last)[0]
    ro = None if module is None else torch.compile(module, mode="reduce-overhead", dynamic=False)
    firsts, keep = {}, []
    for text in args.shapes.split(","):
        b, s = map(int, text.split("x"))
        inputs = spec.inputs(b, s)
        feeds = {k: v.cuda() for k, v in inputs.items()}
        firsts[text] = (feeds, {k: v.clone() for k, v in step(f"{text} dynamic first", lambda: ctx.run(feeds)).items()})
        got = step(f"{text} dynamic second (capture)", lambda: ctx.run(feeds))
        print(f"    capture vs first: max diff {same(got, firsts[text][1]):.3g}", flush=True)
        static = step(f"{text} static build", lambda: kiln.build(path, kiln.BuildConfig(
            profiles=({k: (tuple(v.shape),) * 3 for k, v in feeds.items()},), **config)))
        sctx = static.create_context()
        step(f"{text} static calls", lambda: [sctx.run(feeds) for _ in range(2)])
        keep.append(sctx)
        step(f"{text} empty_cache", torch.cuda.empty_cache)
        if module is not None:
            args16 = cast_inputs(inputs, "fp16", "cuda", spec.channels_last)
            with torch.no_grad():
                step(f"{text} eager", lambda: [module(*args16) for _ in range(2)])
                step(f"{text} reduce-overhead", lambda: [ro(*args16) for _ in range(2)])
            step(f"{text} empty_cache", torch.cuda.empty_cache)
        step(f"{text} cuBLAS workspaces cleared (as reduce-overhead does), empty_cache",
             lambda: (torch._C._cuda_clearCublasWorkspaces(), torch.cuda.empty_cache()))
        gc.collect()
        got = step(f"{text} dynamic replay after the others", lambda: ctx.run(feeds))
        print(f"    replay vs first: max diff {same(got, firsts[text][1]):.3g}", flush=True)
    junk = step("garbage in freed memory", lambda: torch.full((torch.cuda.mem_get_info()[0] // 2 // 4,), float("nan"),
                                                               device="cuda"))
    for text, (feeds, first) in firsts.items():
        got = step(f"{text} dynamic replay at the end", lambda: ctx.run(feeds))
        print(f"    replay vs first: max diff {same(got, first):.3g}", flush=True)
    del junk
    print("all steps passed", flush=True)


if __name__ == "__main__":
    main()
