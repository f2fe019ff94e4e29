"""MobileNetV2's depthwise convs at batch 64 in fp16 on NHWC inputs: every tile kiln offers (level 4) by kind (flat
pixel runs, 2-D patches, row sweeps on pointer loads, row sweeps on TMA loads), each inside a CUDA graph and checked
against cuDNN, next to the bytes' floor. Writes JSON to --out.

    python -m benchmarks.probes.gpu_depthwise_rows_probe --out dw-rows.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.probes.harness import graph_ms, parser, write_json
from kiln.kernels import depthwise_conv as dw

BANDWIDTH = 4.8e12
# (name, channels, side, stride)
SHAPES = [("dw32@112", 32, 112, 1), ("dw96@112/2", 96, 112, 2), ("dw144@56", 144, 56, 1), ("dw144@56/2", 144, 56, 2),
          ("dw192@28", 192, 28, 1), ("dw384@14", 384, 14, 1), ("dw576@14", 576, 14, 1), ("dw960@7", 960, 7, 1)]


def _kind(cfg: dict) -> str:
    if cfg["TMA_STAGES"]:
        return "tma"
    return "rows" if cfg["BLOCK_R"] else "patch" if cfg["TILE_W"] else "flat"


def row(name: str, c: int, side: int, stride: int, batch: int) -> dict:
    x = torch.randn(batch, c, side, side, device="cuda").half().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(c, 1, 3, 3, device="cuda") * 0.2).half()
    b = torch.randn(c, device="cuda").half()
    want = F.conv2d(x, w, b, stride, 1, 1, c).clamp_(0, 6)
    packed, side_out = dw.pack_weight(w), want.shape[-1]
    out = {"shape": name, "floor_us": (x.numel() + want.numel()) * 2 / BANDWIDTH * 1e6, "us": {}}
    for cfg in dw.configs(want.numel() // c, c, 4, side_out, side_out, True, True, stride):
        fn = lambda cfg=cfg: dw.depthwise_conv2d(x, packed, (3, 3), (stride, stride), [1] * 4, (1, 1), b,  # noqa: E731
                                                 activation="clip", act_alpha=0.0, act_beta=6.0, config=cfg)
        key = f"{_kind(cfg)} {tuple(cfg.values())}"
        err = (fn().float() - want.float()).abs().max().item()
        out["us"][key] = graph_ms(fn) * 1e3 if err <= 0.05 else f"wrong: max err {err:.3g}"
    best = {}
    for key, t in out["us"].items():
        kind = key.split()[0]
        if isinstance(t, float) and t < best.get(kind, (1e9,))[0]:
            best[kind] = (t, key)
    out["best"] = best
    print(name, "floor", round(out["floor_us"], 1), {k: (round(v[0], 1), v[1]) for k, v in best.items()}, flush=True)
    return out


def main() -> None:
    ap = parser(__doc__, out="dw-rows.json")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    write_json(args.out, {"batch": args.batch, "rows": [row(*s, args.batch) for s in SHAPES]})


if __name__ == "__main__":
    main()
