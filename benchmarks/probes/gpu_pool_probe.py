"""Pooling kernels against their bandwidth floor at int8 ResNet-50 batch 256's shapes: GlobalAveragePool of the last
map [256, 2048, 7, 7] in fp16 / fp32, NCHW and channels_last, every config of each layout's kernel, and the one
kernel (pixel blocks x channel blocks) that read both layouts before, with its three configs; MaxPool of the
stem's int8 [256, 64, 112, 112] NHWC. Floor: the bytes moved ÷ a device-to-device copy's rate, same process.

    python -m benchmarks.probes.gpu_pool_probe --out $OUT/pool-probe.json
"""

from __future__ import annotations

import torch
import triton

from benchmarks.probes.harness import banner, graph_ms, parser, write_json
from kiln.kernels import pool


OLD_CONFIGS = [{"BLOCK_HW": 32, "BLOCK_C": 128, "num_warps": 4}, {"BLOCK_HW": 64, "BLOCK_C": 64, "num_warps": 4},
               {"BLOCK_HW": 16, "BLOCK_C": 256, "num_warps": 4}]  # the configs before 2026-11-28 (stop 41)


def _old_global(x: torch.Tensor, y: torch.Tensor, cfg: dict):
    n, c, h, w = x.shape
    return lambda: pool._global_pool_kernel[(n, triton.cdiv(c, cfg["BLOCK_C"]))](
        x, y, c, h * w, x.stride(0), x.stride(1), x.stride(3), 1.0 / (h * w), MAX=False, BLOCK_HW=cfg["BLOCK_HW"],
        BLOCK_C=cfg["BLOCK_C"], num_warps=cfg["num_warps"])


def main() -> None:
    args = parser(__doc__, required=True).parse_args()
    banner()
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    copy_ms = graph_ms(lambda: big.clone())
    gbps = 2 * big.numel() / copy_ms / 1e6
    print(f"copy rate {gbps:.0f} GB/s", flush=True)
    rows = []
    for dtype in (torch.float16, torch.float32):
        for layout in ("nchw", "nhwc"):
            x = torch.randn(256, 2048, 7, 7, device="cuda").to(dtype)
            if layout == "nhwc":
                x = x.contiguous(memory_format=torch.channels_last)
            y = torch.empty(256, 2048, 1, 1, device="cuda", dtype=dtype)
            floor = (x.numel() + y.numel()) * x.element_size() / gbps / 1e6
            want = x.float().mean((2, 3), keepdim=True)
            torch_ms = graph_ms(lambda: x.mean((2, 3), keepdim=True))
            for cfg in pool.GLOBAL_CONFIGS:
                if cfg["layout"] != layout:
                    continue
                new = graph_ms(lambda: y.copy_(pool.global_pool2d(x, "avg", cfg)))
                ok = torch.allclose(y.float(), want, atol=1e-2)
                rows.append({"op": "GlobalAveragePool", "dtype": str(dtype), "layout": layout, "config": cfg,
                             "ms": new, "torch_ms": torch_ms, "floor_ms": floor, "correct": ok})
                print(f"gap {dtype} {layout} {cfg}: {new * 1e3:.1f} us torch {torch_ms * 1e3:.1f} floor "
                      f"{floor * 1e3:.1f} ok {ok}", flush=True)
            for cfg in OLD_CONFIGS:
                old = graph_ms(_old_global(x, y, cfg))
                rows.append({"op": "GlobalAveragePool", "kernel": "before", "dtype": str(dtype), "layout": layout,
                             "config": cfg, "ms": old})
                print(f"gap {dtype} {layout} before {cfg}: {old * 1e3:.1f} us", flush=True)
    x = torch.randint(-128, 128, (256, 64, 112, 112), dtype=torch.int8, device="cuda").contiguous(
        memory_format=torch.channels_last)
    y = torch.empty(256, 64, 56, 56, dtype=torch.int8, device="cuda").contiguous(memory_format=torch.channels_last)
    floor = (x.numel() + y.numel()) / gbps / 1e6
    for cfg in pool.CONFIGS:
        t = graph_ms(lambda: pool.max_pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1), (56, 56), cfg))
        rows.append({"op": "MaxPool", "dtype": "int8", "layout": "nhwc", "config": cfg, "ms": t, "floor_ms": floor})
        print(f"maxpool int8 {cfg}: {t * 1e3:.1f} us floor {floor * 1e3:.1f}", flush=True)
    write_json(args.out, {"copy_gbps": gbps, "rows": rows})


if __name__ == "__main__":
    main()
