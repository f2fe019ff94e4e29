"""Probe: a dynamic MiniLM engine against static ones at a few shapes (timings, tactics, graph capture).

    PYTHONPATH=src:. python -m benchmarks.probes.gpu_dynamic_probe --out /tmp/out.json
"""

from __future__ import annotations

import collections
import time
from pathlib import Path


import kiln
from benchmarks.models import SPECS, instantiate, onnx_file
from benchmarks.probes import harness

NAMES = ["input_ids", "attention_mask", "token_type_ids"]


def main() -> None:
    args = harness.parser(__doc__, out="/tmp/gpu_dynamic_probe.json").parse_args()
    clock = harness.Budget(540)
    spec = SPECS["minilm"]
    path, _ = onnx_file(spec, instantiate(spec, 128), 128, Path("/tmp/kiln-probe-cache"), dynamic_seq=True)
    cache = "/tmp/kiln-probe-cache/timing.db"
    t = time.perf_counter()
    dyn = kiln.build(str(path), kiln.BuildConfig(fp16=True, timing_cache=cache, profiles=(
        {n: ((1, 16), (8, 128), (32, 512)) for n in NAMES},)))
    out = {"dynamic_build_s": time.perf_counter() - t, "dynamic_tactics": dyn.tactic_summary(),
           "shape_steps": len(dyn.shape_program.steps), "run_layers": len(dyn.shape_program.run_net.layers),
           "rows": []}
    clock.log(f"dynamic built: {out['dynamic_tactics']}")
    ctx = dyn.create_context()
    for b, s in [(1, 16), (8, 128), (4, 77), (32, 512)]:
        feeds = {k: v.cuda() for k, v in spec.inputs(b, s).items()}
        harness.sync()
        t = time.perf_counter()
        ctx.run(feeds)
        harness.sync()
        first = (time.perf_counter() - t) * 1e3
        row = {"shape": f"{b}x{s}", "dynamic_first_ms": first, "dynamic_ms": harness.wall_ms(lambda: ctx.run(feeds)),
               "eager": dict(ctx.eager_reasons)}
        if clock.left > 120:
            st = kiln.build(str(path), kiln.BuildConfig(fp16=True, timing_cache=cache, profiles=(
                {n: ((b, s), (b, s), (b, s)) for n in NAMES},)))
            sctx = st.create_context()
            row["static_ms"] = harness.wall_ms(lambda: sctx.run(feeds))
            row["static_tactics"] = st.tactic_summary()
            a, c = ctx.run(feeds)["last_hidden_state"], sctx.run(feeds)["last_hidden_state"]
            row["max_diff"] = float((a.float() - c.float()).abs().max())
            row["static_kinds"] = dict(collections.Counter(l.kind for l in st.network.layers))
        out["rows"].append(row)
        clock.log(str({k: v for k, v in row.items() if "kinds" not in k}))
    out["dynamic_run_kinds"] = dict(collections.Counter(l.kind for l in dyn.shape_program.run_net.layers))
    out["dynamic_layer_tactics"] = {l.name: (l.kind, dyn.tactics[l.name].tactic) for l in dyn.network.layers}
    harness.write_json(args.out, out)


if __name__ == "__main__":
    main()
