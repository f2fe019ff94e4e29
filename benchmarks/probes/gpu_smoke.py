"""GPU smoke check: build small and real models on CUDA, compare with the CPU reference, time vs torch.

    python -m benchmarks.probes.gpu_smoke [--out DIR]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


import kiln
from benchmarks.probes.harness import banner, cosine, event_ms, parser, write_json
from tests.models.export import export


def check_model(name, model, x, out_dir, results, **cfg):
    path = out_dir / f"{name}.onnx"
    if not path.exists():
        export(model.cpu().float(), (x.cpu(),), path, dynamo=False, input_names=["input"], output_names=["out"])
    row = {"model": name, **cfg}
    try:
        t0 = time.perf_counter()
        config = kiln.BuildConfig.with_shapes({"input": tuple(x.shape)}, device="cuda",
                                              timing_cache=str(out_dir / "timing.db"), **cfg)
        engine = kiln.build(path, config)
        row["build_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        kiln.build(path, config)
        row["rebuild_s"] = round(time.perf_counter() - t0, 2)
        row["tactics"] = engine.build_info.get("tactics")
        row["layers"] = len(engine.network.layers)
        ctx = engine.create_context()
        xg = x.cuda()
        got = ctx.run({"input": xg})["out"]
        with torch.no_grad():
            want = model.cuda().float()(xg.float())
        row["cosine_vs_torch_fp32"] = cosine(got.float(), want)
        row["kiln_ms"] = event_ms(lambda: ctx.run({"input": xg}))
        row["graph_eager_reasons"] = {str(k): v for k, v in ctx.eager_reasons.items()}
        m = model.cuda().eval()
        if cfg.get("fp16"):
            m = m.half()
            xg = xg.half()
        with torch.no_grad():
            row["torch_eager_ms"] = event_ms(lambda: m(xg))
        rejected = {}
        for lname, c in engine.tactics.items():
            for tac, why in c.rejected:
                rejected.setdefault(why[:80], 0)
                rejected[why[:80]] += 1
        row["rejections"] = dict(sorted(rejected.items(), key=lambda kv: -kv[1])[:8])
    except Exception:  # noqa: BLE001 - a smoke check reports, it does not stop
        import traceback
        row["error"] = traceback.format_exc()[-1500:]
    results.append(row)
    print(json.dumps(row, indent=1, default=str), flush=True)


def main():
    ap = parser(__doc__, out="/tmp/kiln-smoke")
    ap.add_argument("--models", default="resnet50,bert")
    ap.add_argument("--fp16", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    banner()
    torch.manual_seed(0)
    if "resnet50" in args.models:
        import torchvision
        check_model("resnet50", torchvision.models.resnet50().eval(), torch.randn(1, 3, 224, 224), out, results,
                    fp16=args.fp16)
    if "vit" in args.models:
        import torchvision
        vit = torchvision.models.vit_b_16().eval()
        torch.nn.init.normal_(vit.heads.head.weight, std=0.02)  # torchvision zero-initializes the head
        check_model("vit_b_16", vit, torch.randn(1, 3, 224, 224), out, results,
                    fp16=args.fp16)
    write_json(out / "smoke.json", {"rows": results})


if __name__ == "__main__":
    main()
