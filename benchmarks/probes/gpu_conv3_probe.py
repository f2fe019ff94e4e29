"""On a Hopper GPU: ResNet-50 b64's 3x3 convs (layers 3-4 stride 1, layers 2-4 stride 2) through each int8 conv \
kernel kiln has
at every config (and extra TMA-conv tiles given on the command line), timed by CUDA-graph replay, each checked
bit for bit against the pointer conv (kernels/int8_conv.py).

    python -m benchmarks.probes.gpu_conv3_probe --out results.json
"""

from __future__ import annotations


import torch

from benchmarks.probes.harness import SMEM, graph_ms, parser, write_json
from kiln.kernels import int8_conv, int8_conv_halo, int8_gemm_wgmma as wg

# (label, N, C, H, CO, stride)
SHAPES = [("l3 3x3 256", 64, 256, 14, 256, 1), ("l4 3x3 512", 64, 512, 7, 512, 1),
          ("l3.0 3x3 s2 256", 64, 256, 28, 256, 2), ("l4.0 3x3 s2 512", 64, 512, 14, 512, 2),
          ("l2.0 3x3 s2 128", 64, 128, 56, 128, 2)]
EXTRA_TMA = [(1, 8, 8, 128, 128, 4, 4), (2, 8, 8, 128, 128, 4, 8), (1, 16, 16, 128, 128, 4, 8),
             (2, 8, 8, 128, 64, 4, 8), (1, 8, 16, 128, 128, 4, 8), (1, 16, 8, 128, 128, 3, 8),
             (1, 8, 8, 64, 128, 4, 4), (1, 4, 16, 128, 128, 4, 4)]


def main() -> None:
    ap = parser(__doc__)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, n, c, h, co, stride in SHAPES:
        x = torch.randint(-100, 100, (n, c, h, h), device="cuda", dtype=torch.int8, generator=g)
        x = x.contiguous(memory_format=torch.channels_last)
        w = torch.randint(-100, 100, (co, c, 3, 3), device="cuda", dtype=torch.int8, generator=g)
        packed = int8_conv.pack_weight(w)
        s, b = (torch.rand(co, device="cuda", generator=g) * 1e-4 for _ in range(2))
        kw = dict(out_scale=0.05, activation="relu")
        want = int8_conv.conv2d(x, packed, s, (3, 3), (stride, stride), [1, 1, 1, 1], (1, 1), b, **kw)
        row = {"shape": label, "N": n, "C": c, "H": h, "CO": co, "stride": stride, "runs": []}

        def go(kernel, cfg, run):
            try:
                exact = bool(torch.equal(run(), want))
                row["runs"].append([kernel, cfg, graph_ms(run) * 1e3, exact])
            except Exception as e:  # noqa: BLE001 - report and go on
                row["runs"].append([kernel, cfg, None, f"{type(e).__name__}: {str(e)[:200]}"])
            print(label, row["runs"][-1], flush=True)

        oh = (h - 1) // stride + 1
        for cfg in int8_conv.configs(n * oh * oh, co, c, SMEM, 3)[:8]:
            go("pointer", cfg, lambda cfg=cfg: int8_conv.conv2d(x, packed, s, (3, 3), (stride, stride), [1, 1, 1, 1],
                                                                 (1, 1), b, config=cfg, **kw))
        tma = wg.conv_configs(oh, oh, co, c, SMEM) + [dict(zip(wg.CONV_KEYS, t)) for t in EXTRA_TMA]
        for cfg in tma:
            if stride > 1 and c % cfg["BLOCK_K"]:
                continue
            go("tma", cfg, lambda cfg=cfg: wg.conv2d(x, packed, s, (3, 3), [1, 1, 1, 1], (1, 1), b, config=cfg,
                                                     strides=(stride, stride), **kw))
        if stride == 1:
            for cfg in int8_conv_halo.configs((3, 3), oh, oh, co, c, SMEM, False):
                for stream in (1, 2):
                    cfg = {**cfg, "stream": stream}
                    go("halo", cfg, lambda cfg=cfg: int8_conv_halo.conv2d(x, packed, s, (3, 3), [1, 1, 1, 1], b,
                                                                         config=cfg, **kw))
        timed = sorted((r[2], r[0], r[1]) for r in row["runs"] if r[2] is not None and r[3] is True)
        print(f"== {label}: best {timed[:3]}", flush=True)
        rows.append(row)
    if args.out:
        write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
