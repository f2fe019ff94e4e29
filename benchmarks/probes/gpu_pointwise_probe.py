"""MobileNetV2's 1x1 convs at batch 64 in fp16 on NHWC inputs (GEMMs of few input channels that write many bytes):
cuDNN, cuBLAS on the [N·H·W, C] view, and kiln's TMA-fed Triton GEMM (kernels/gemm_tma.py) at tiles sized to the
layer, each with bias and ReLU6 inside a CUDA graph, next to the bytes' floor. Question: how far under the floor
(4x in kiln's engine, stop 51) can a 1x1 conv get? Writes JSON to --out.

    python -m benchmarks.probes.gpu_pointwise_probe --out pointwise.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from benchmarks.probes.harness import graph_ms, parser, write_json
from kiln.kernels import gemm_tma

BANDWIDTH = 4.8e12
# (name, input channels, output channels, side)
SHAPES = [("16→96@112", 16, 96, 112), ("32→16@112", 32, 16, 112), ("96→24@56", 96, 24, 56), ("24→144@56", 24, 144, 56),
          ("144→24@56", 144, 24, 56), ("32→192@28", 32, 192, 28), ("192→32@28", 192, 32, 28),
          ("64→384@14", 64, 384, 14), ("384→64@14", 384, 64, 14), ("96→576@14", 96, 576, 14),
          ("160→960@7", 160, 960, 7), ("960→160@7", 960, 160, 7), ("320→1280@7", 320, 1280, 7)]


def _tiles(n: int, k: int) -> list[dict]:
    bn, bk = min(256, max(16, triton.next_power_of_2(n))), min(64, max(16, triton.next_power_of_2(k)))
    out = []
    for bm, nw in ((128, 4), (128, 8), (256, 8)):
        for persistent in (False, True):
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=nw, num_stages=3,
                            persistent=persistent))
    if bn > 64:  # a narrower tile: more programs, a smaller output tile in shared memory
        out.append(dict(BLOCK_M=128, BLOCK_N=bn // 2, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=4,
                        persistent=True))
    return out


def row(name: str, c: int, co: int, side: int, batch: int) -> dict:
    x = torch.randn(batch, c, side, side, device="cuda").half().contiguous(memory_format=torch.channels_last)
    w = (torch.randn(co, c, 1, 1, device="cuda") * 0.2).half()
    b = torch.randn(co, device="cuda").half()
    want = F.conv2d(x, w, b).clamp_(0, 6)
    a, w2 = x.permute(0, 2, 3, 1).reshape(-1, c), w.reshape(co, c)
    wm = w.contiguous(memory_format=torch.channels_last)
    out = {"shape": name, "floor_us": (x.numel() + want.numel() + w.numel()) * 2 / BANDWIDTH * 1e6,
           "cudnn_nhwc_us": graph_ms(lambda: F.conv2d(x, wm, b).clamp_(0, 6)) * 1e3,
           "cublas_us": graph_ms(lambda: torch.addmm(b, a, w2.t()).clamp_(0, 6)) * 1e3, "tma_us": {}}
    for cfg in _tiles(co, c):
        key = str(tuple(cfg.values()))
        try:
            fn = lambda cfg=cfg: gemm_tma.matmul(a, w2, b, activation="clip", act_alpha=0.0,  # noqa: E731
                                                 act_beta=6.0, config=cfg)
            err = (fn().float() - want.permute(0, 2, 3, 1).reshape(-1, co).float()).abs().max().item()
            out["tma_us"][key] = graph_ms(fn) * 1e3 if err <= 0.05 else f"wrong: max err {err:.3g}"
        except Exception as e:  # noqa: BLE001 - a probe reports a tile that fails and goes on
            out["tma_us"][key] = f"failed: {type(e).__name__}: {str(e)[:160]}"
    times = {k: v for k, v in out["tma_us"].items() if isinstance(v, float)}
    out["tma_best"] = min(times.items(), key=lambda kv: kv[1]) if times else None
    print(name, "floor", round(out["floor_us"], 1), "cudnn", round(out["cudnn_nhwc_us"], 1), "cublas",
          round(out["cublas_us"], 1), "tma", out["tma_best"] and (round(out["tma_best"][1], 1), out["tma_best"][0]),
          flush=True)
    return out


def main() -> None:
    ap = parser(__doc__, out="pointwise.json")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    write_json(args.out, {"batch": args.batch, "rows": [row(*s, args.batch) for s in SHAPES]})


if __name__ == "__main__":
    main()
