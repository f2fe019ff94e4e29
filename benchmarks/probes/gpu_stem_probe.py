"""On an H100: ResNet-50's stem at batch 64 as an int8 engine runs it (QuantizeLinear of the fp32 image, the
7x7/2 3→64 int8 conv + ReLU requantized, the 3x3/2 MaxPool) against cuDNN fp16, each kernel inside a CUDA graph
(benchmarks.probes.harness.graph_ms). Conv variants: the image quantized NCHW (as now) or NHWC; BLOCK_K 32-256.
Writes JSON to --out.

    python -m benchmarks.probes.gpu_stem_probe --out stem.json
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from benchmarks.probes.harness import best, facts, graph_ms, parser, write_json
from kiln.kernels import int8_conv, pool, quantize

TILES = [(bm, 64, bk, w, 3) for bm in (128, 256) for bk in (32, 64, 128) for w in (4, 8)]


def main() -> None:
    ap = parser(__doc__, out="stem-probe.json")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    n = args.batch
    g = torch.Generator(device="cuda").manual_seed(0)
    img = torch.randn(n, 3, 224, 224, device="cuda", generator=g)
    w = torch.randn(64, 3, 7, 7, device="cuda", generator=g)
    bias = torch.randn(64, device="cuda", generator=g)
    row = {"batch": n} | facts()
    img16, w16, b16 = img.half(), w.half(), bias.half()
    row["fp16_cudnn_stem_nchw"] = graph_ms(lambda: torch.cudnn_convolution_relu(img16, w16, b16, (2, 2), (3, 3),
                                                                                 (1, 1), 1))
    img16cl, w16cl = (t.contiguous(memory_format=torch.channels_last) for t in (img16, w16))
    row["fp16_cudnn_stem_nhwc"] = graph_ms(lambda: torch.cudnn_convolution_relu(img16cl, w16cl, b16, (2, 2), (3, 3),
                                                                          (1, 1), 1))
    print(json.dumps(row), flush=True)
    row["quantize_nchw"] = graph_ms(lambda: quantize.quantize(img, 0.02))
    row["to_nhwc_copy_fp32"] = graph_ms(lambda: img.contiguous(memory_format=torch.channels_last))
    x8 = quantize.quantize(img, 0.02)
    x8cl = x8.contiguous(memory_format=torch.channels_last)
    wq = w.clamp(-1.27, 1.27).mul(100).round().to(torch.int8)
    packed = int8_conv.pack_weight(wq)
    scale = torch.full((64,), 2e-4, device="cuda")
    for label, x in (("nhwc", x8cl), ("nchw", x8)):
        fns = [(str(t), lambda t=t, x=x: int8_conv.conv2d(x, packed, scale, (7, 7), (2, 2), [3] * 4, (1, 1), bias,
                                                        out_scale=0.05, activation="relu",
                                                        config=dict(zip(int8_conv.CONFIG_KEYS, t))))
               for t in TILES]
        row[f"int8_stem_{label}"] = best(fns)
        print(label, row[f"int8_stem_{label}"], flush=True)
    ref = int8_conv.conv2d(x8, packed, scale, (7, 7), (2, 2), [3] * 4, (1, 1), bias, out_scale=0.05, activation="relu")
    got = int8_conv.conv2d(x8cl, packed, scale, (7, 7), (2, 2), [3] * 4, (1, 1), bias, out_scale=0.05,
                           activation="relu")
    row["nhwc_equal"] = bool(torch.equal(ref, got))
    y16 = torch.randn(n, 64, 112, 112, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    y8 = ref
    row["maxpool_torch_fp16_nhwc"] = graph_ms(lambda: F.max_pool2d(y16, 3, 2, 1))
    for label, y in (("fp16", y16), ("int8", y8)):
        row[f"maxpool_triton_{label}"] = best([(str(c), lambda c=c, y=y: pool.max_pool2d(
            y, (3, 3), (2, 2), (1, 1), (1, 1), (56, 56), c)) for c in pool.CONFIGS])
    row["maxpool_int8_equal"] = bool(torch.equal(pool.max_pool2d(y8, (3, 3), (2, 2), (1, 1), (1, 1), (56, 56)).float(),
                                                 F.max_pool2d(y8.float(), 3, 2, 1)))
    print(json.dumps(row, indent=1), flush=True)
    write_json(args.out, row)


if __name__ == "__main__":
    main()
