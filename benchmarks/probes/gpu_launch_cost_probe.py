"""On a GPU: per kernel, the device time in a CUDA graph, the autotuner's event timing (harness.autotuner_us) and
the host's enqueue time per call, for the Gluon halo conv, the streaming GEMM and the pointer conv at ResNet-50 b64's
layer-1 shapes: whether host launch cost leaks into the autotuner's numbers.

    python -m benchmarks.probes.gpu_launch_cost_probe --out probe.json
"""

from __future__ import annotations

import time

import torch

from benchmarks.probes.harness import SMEM, autotuner_us, graph_ms, parser, write_json
from kiln.kernels import int8_conv, int8_conv_halo as halo, int8_gemm_wgmma as wg


def host_us(fn, calls=50):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main() -> None:
    ap = parser(__doc__, out="launch-probe.json")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(-100, 100, (64, 64, 56, 56), device="cuda", dtype=torch.int8, generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    packed = int8_conv.pack_weight(torch.randint(-100, 100, (64, 64, 3, 3), device="cuda", dtype=torch.int8))
    scale, bias = torch.full((64,), 1e-4, device="cuda"), torch.randn(64, device="cuda")
    kw = dict(out_scale=0.05, activation="relu")
    a = x.permute(0, 2, 3, 1).reshape(-1, 64)
    w1 = torch.randint(-100, 100, (256, 64), device="cuda", dtype=torch.int8)
    s1, b1 = torch.full((256,), 1e-4, device="cuda"), torch.randn(256, device="cuda")
    fns = {f"halo {c}": (lambda c=c: halo.conv2d(x, packed, scale, (3, 3), [1] * 4, bias, config=c, **kw))
           for c in halo.configs(3, 56, 56, 64, 64, SMEM, False)[:8]}
    fns["pointer conv"] = lambda: int8_conv.conv2d(x, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, **kw)
    for c in wg.stream_configs(256, 64, SMEM, False)[:2]:
        fns[f"stream {c}"] = lambda c=c: wg.matmul(a, w1, s1, b1, config=c, **kw)
    rows = []
    for label, fn in fns.items():
        row = {"kernel": label, "graph_us": graph_ms(fn) * 1e3, "autotune_us": autotuner_us(fn),
               "host_us": host_us(fn)}
        rows.append(row)
        print(f"{label[:100]:100} graph {row['graph_us']:7.1f}  autotune {row['autotune_us']:7.1f}  host "
              f"{row['host_us']:7.1f}", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
