"""MobileNetV2's depthwise convs and the CNN stems at batch 64 in fp16: the Triton CUDA-core kernels
(kernels/depthwise_conv.py, direct_conv.py), every config, on NHWC and NCHW inputs, against cuDNN (NCHW and NHWC),
each inside a CUDA graph, next to the bytes' floor at 4.8 TB/s. Writes JSON to --out.

    python -m benchmarks.probes.gpu_cuda_core_conv_probe --out cuda-core-conv.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.probes.harness import graph_ms, parser, write_json
from kiln.kernels import conv, depthwise_conv, direct_conv

BANDWIDTH = 4.8e12  # H200 HBM3e bytes/s
# (name, input channels, output channels, side, kernel, stride): depthwise when in = out and not a stem
SHAPES = [("dw32@112", 32, 32, 112, 3, 1), ("dw96@112/2", 96, 96, 112, 3, 2), ("dw144@56", 144, 144, 56, 3, 1),
          ("dw144@56/2", 144, 144, 56, 3, 2), ("dw192@28", 192, 192, 28, 3, 1), ("dw576@14", 576, 576, 14, 3, 1),
          ("dw960@7", 960, 960, 7, 3, 1), ("stem3→32 3x3/2", 3, 32, 224, 3, 2),
          ("dw32@112 1x1", 32, 32, 112, 1, 1), ("dw144@56 1x1", 144, 144, 56, 1, 1)]  # one tap: the kernel's IO alone


def row(name, c, co, side, k, stride, batch) -> dict:
    depthwise = c == co
    p = k // 2
    x = torch.randn(batch, c, side, side, device="cuda").half()
    w = (torch.randn(co, 1 if depthwise else c, k, k, device="cuda") * 0.2).half()
    b = torch.randn(co, device="cuda").half()
    groups = co if depthwise else 1
    out = {"shape": name}
    for fmt, mem in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        xm, wm = x.contiguous(memory_format=mem), w.contiguous(memory_format=mem)
        out[f"cudnn_{fmt}_us"] = graph_ms(lambda: F.conv2d(xm, wm, b, stride, p, 1, groups).clamp_(0, 6)) * 1e3
    mod = depthwise_conv if depthwise else direct_conv
    launch = depthwise_conv.depthwise_conv2d if depthwise else direct_conv.direct_conv2d
    packed = (depthwise_conv.pack_weight if depthwise else conv.pack_weight)(w)
    side_out = (side + 2 * p - k) // stride + 1
    ys = batch * co * side_out ** 2
    for fmt, mem in (("nhwc", torch.channels_last), ("nchw", torch.contiguous_format)):
        xm, times, tiles = x.contiguous(memory_format=mem), {}, {}
        rows = depthwise_conv.sweeps_rows((k, k), (stride, stride), (1, 1))
        sweep = {"ow": side_out, "oh": side_out, "rows": rows, "tma": rows, "stride": stride}
        for cfg in mod.configs(ys // co, co, 4, **(sweep if depthwise else {"dot": True})):  # fp16: DOT tiles too
            fn = lambda cfg=cfg: launch(xm, packed, (k, k), (stride, stride), [p] * 4, (1, 1), b,  # noqa: E731
                                        activation="clip", act_alpha=0.0, act_beta=6.0, config=cfg)
            tiles[str(tuple(cfg.values()))] = cfg
            times[str(tuple(cfg.values()))] = graph_ms(fn) * 1e3
        top = min(times, key=times.get)
        out[f"triton_{fmt}_us"], out[f"triton_{fmt}_config"], out[f"triton_{fmt}_all"] = times[top], top, times
        if depthwise:  # the best flat run of pixels, 2-D patch, row sweep and TMA row sweep
            kinds = {"flat": lambda c: not c["TILE_W"] and not c["BLOCK_R"], "patch": lambda c: c["TILE_W"],
                     "rows": lambda c: c["BLOCK_R"] and not c["TMA_STAGES"], "tma": lambda c: c["TMA_STAGES"]}
            for kind, pick in kinds.items():
                mine = [t for key, t in times.items() if pick(tiles[key])]
                out[f"triton_{fmt}_{kind}_us"] = min(mine) if mine else None
    out["floor_us"] = (x.numel() + ys) * 2 / BANDWIDTH * 1e6
    print(name, {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items() if not k.endswith("_all")},
          flush=True)
    return out


def main() -> None:
    ap = parser(__doc__, out="cuda-core-conv.json")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shapes", default="", help="comma-separated substrings: only the shapes named so")
    args = ap.parse_args()
    want = [w for w in args.shapes.split(",") if w]
    rows = [row(*s, args.batch) for s in SHAPES if not want or any(w in s[0] for w in want)]
    write_json(args.out, {"batch": args.batch, "rows": rows})


if __name__ == "__main__":
    main()
