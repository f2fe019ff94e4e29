"""What a convolution costs the first time it runs at a new shape (issue 23: a dynamic ResNet-50's first call at a new
batch): each of ResNet-50's convs (fp16, channels_last, cuDNN heuristics, no search) timed on its first and second call
at new batch sizes, in subprocesses with and without the cuDNN v7 API (TORCH_CUDNN_V8_API_DISABLED=1).

    python -m benchmarks.probes.gpu_conv_cold --out $OUT/conv-cold.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from benchmarks.probes.harness import parser, write_json

ENVS = {"default": {}, "v7 api": {"TORCH_CUDNN_V8_API_DISABLED": "1"}}


def shapes() -> list[tuple]:
    """(in channels, out channels, kernel, stride, padding, input H) of every conv in ResNet-50 at 224x224."""
    from tests.models.vision import ResNet50

    model, seen = ResNet50(), []
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(lambda mod, inp, out: seen.append(
                (mod.in_channels, mod.out_channels, mod.kernel_size[0], mod.stride[0], mod.padding[0],
                 inp[0].shape[2])))
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    return seen


def child(batches: list[int]) -> dict:
    torch.backends.cudnn.benchmark = False
    convs = []
    for ci, co, k, s, p, h in shapes():
        w = torch.randn(co, ci, k, k, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        convs.append((w, s, p, ci, h))
    out = {}
    for b in batches:
        xs = [torch.randn(b, ci, h, h, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
              for _, _, _, ci, h in convs]
        torch.cuda.synchronize()
        first, second = [], []
        for (w, s, p, _, _), x in zip(convs, xs):
            for times in (first, second):
                t = time.perf_counter()
                torch.nn.functional.conv2d(x, w, stride=s, padding=p)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) * 1e3)
        out[b] = {"convs": len(convs), "first_ms_sum": round(sum(first), 2), "second_ms_sum": round(sum(second), 2),
                  "first_ms_max": round(max(first), 2)}
    return out


def main() -> None:
    ap = parser(__doc__, out="conv-cold.json")
    ap.add_argument("--batches", default="5,7,13")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(child(batches)))
        return
    results = {}
    for name, env in ENVS.items():
        proc = subprocess.run([sys.executable, "-m", "benchmarks.probes.gpu_conv_cold", "--child", "--batches",
                               args.batches], env=os.environ | env, capture_output=True, text=True)
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
            {"error": proc.stderr[-2000:]}
        print(name, results[name], flush=True)
    write_json(args.out, {"what": "ResNet-50 convs fp16 channels_last: first and second call at new batch sizes, ms "
                                  "(synchronized, summed over the convs)", "results": results})


if __name__ == "__main__":
    main()
