"""Where a dynamic engine's first call at a new shape goes (issue 23: ≤ 50 ms): builds MiniLM or BERT with the
benchmark's profile (1x16 / 8x128 / 32x512), then for each shape times the first call (synchronized), the second, and
prints a cProfile of the first call by cumulative time.

    python -m benchmarks.probes.gpu_first_call --model bert --shapes 4x64,2x32,16x100 --out $OUT/first-call.json
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import kiln
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.probes.harness import parser, sync, write_json
from benchmarks.suite import CACHE


def main() -> None:
    ap = parser(__doc__, out="first-call.json")
    ap.add_argument("--model", default="bert")
    ap.add_argument("--shapes", default="4x64,2x32,16x100")
    args = ap.parse_args()
    spec = SPECS[args.model]
    made = instantiate(spec, spec.default_size)
    path, _ = onnx_file(spec, made, spec.default_size, CACHE, dynamic_seq=True)
    profile = {n: ((1, 16), (8, 128), (32, 512)) for n in spec.input_names}
    start = time.perf_counter()
    engine = kiln.build(path, kiln.BuildConfig(profiles=(profile,), fp16=True,
                                               timing_cache=str(CACHE / "timing-cache.sqlite")))
    build_s = time.perf_counter() - start
    ctx = engine.create_context()
    rows = {}
    for item in args.shapes.split(","):
        b, s = (int(x) for x in item.split("x"))
        feeds = {k: v.cuda() for k, v in spec.inputs(b, s).items()}
        sync()
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        ctx.run(feeds)
        sync()
        prof.disable()
        first = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        ctx.run(feeds)
        sync()
        second = (time.perf_counter() - t) * 1e3
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(35)
        rows[item] = {"first_ms_profiled": first, "second_ms": second, "profile": out.getvalue()}
        print(item, f"first {first:.1f} ms (profiled), second {second:.2f} ms", flush=True)
        print(out.getvalue()[:6000], flush=True)
    write_json(args.out, {"model": args.model, "build_s": build_s, "warm_up_s": engine.build_info.get(
        "warm_up_seconds"), "rows": rows})


if __name__ == "__main__":
    main()
