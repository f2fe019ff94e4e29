"""On CUDA: the quantized implicit-GEMM conv with its weight N-major (as kernels/conv.py packs it) vs K-major
(int8_conv.pack_weight), against cuDNN fp16 (channels_last) and torch._int_mm on the same ResNet-50 b64 shapes.

    python -m benchmarks.probes.gpu_int8_conv_layout [--out layout.json]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.probes.harness import SMEM, banner, event_ms, parser, write_json
from kiln.kernels import conv, int8_conv

SHAPES = [(64, 64, 56, 64, 3), (64, 256, 56, 64, 1), (64, 64, 56, 256, 1), (64, 128, 28, 128, 3), (64, 512, 7, 2048, 1)]


def ms(fn) -> float:
    return event_ms(fn, iters=30, warmup=5)


def main() -> None:
    args = parser(__doc__, out_help="optional JSON file for the rows").parse_args()
    banner()
    rows = []
    print(f"{'n c hw co k':22} {'cudnn fp16':>10} {'int_mm':>8} "
          + " ".join(f"{t:>22}" for t in ("N-major best", "K-major best")))
    for n, c, hw, co, k in SHAPES:
        x16 = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        w16 = torch.randn(co, c, k, k, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        t_cudnn = ms(lambda: F.conv2d(x16, w16, padding=k // 2))
        x8 = torch.randint(-100, 100, (n, c, hw, hw), device="cuda", dtype=torch.int8).contiguous(
            memory_format=torch.channels_last)
        w8 = torch.randint(-100, 100, (co, c, k, k), device="cuda", dtype=torch.int8)
        t_mm = float("nan")
        if k == 1:
            a = x8.permute(0, 2, 3, 1).reshape(-1, c)
            wt = w8.reshape(co, c).t()
            t_mm = ms(lambda: torch._int_mm(a, wt))
        scale = torch.ones(co, device="cuda")
        best = []
        for packed in (conv.pack_weight(w8), int8_conv.pack_weight(w8)):
            times = []
            for cfg in int8_conv.configs(n * hw * hw, co, c, SMEM, 5)[:8]:
                tiles = {key: cfg[key] for key in int8_conv.CONFIG_KEYS}
                try:
                    times.append((ms(lambda: int8_conv.conv2d(x8, packed, scale, (k, k), (1, 1), [k // 2] * 4, (1, 1),
                                                             out_scale=0.5, config=tiles)), str(tiles)))
                except Exception as e:  # noqa: BLE001
                    times.append((float("inf"), f"{type(e).__name__}"))
            best.append(min(times))
        rows.append({"shape": [n, c, hw, co, k], "cudnn_fp16_ms": t_cudnn, "int_mm_ms": t_mm,
                     "n_major_best": best[0], "k_major_best": best[1]})
        print(f"{n} {c} {hw} {co} {k:<10} {t_cudnn:10.3f} {t_mm:8.3f} "
              + " ".join(f"{t:8.3f} {c_[:60]}" for t, c_ in best))
    if args.out:
        write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
