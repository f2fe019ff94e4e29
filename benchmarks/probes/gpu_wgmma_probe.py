"""On an H100: the Gluon wgmma int8 GEMM and conv (kernels/int8_gemm_wgmma.py) against the Triton TMA GEMM, the
pointer-fed conv, torch._int_mm and fp16 cuBLAS / cuDNN, from a square peak-test GEMM down to ResNet-50 b64 and
BERT-base b64 shapes; every kiln kernel requantizes to int8 (bias, ReLU), best of its configs, TOP/s printed.

    python -m benchmarks.probes.gpu_wgmma_probe --out probe.json
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from benchmarks.probes.harness import CONVS3, SMEM, banner, best, graph_ms, parser, write_json
from kiln.kernels import int8_conv, int8_gemm_tma, int8_gemm_wgmma as wg

# (label, M, K, N, residual?)
GEMMS = [("square 4096", 4096, 4096, 4096, False), ("r50 l2 128->512 +res", 64 * 28 * 28, 128, 512, True),
         ("r50 l1 256->64", 64 * 56 * 56, 256, 64, False),
         ("bert qkv", 8192, 768, 2304, False), ("bert ffn1", 8192, 768, 3072, False),
         ("bert ffn2", 8192, 3072, 768, False), ("r50 l1 64->256 +res", 64 * 56 * 56, 64, 256, True),
         ("r50 l3 1024->256", 64 * 14 * 14, 1024, 256, False), ("r50 l3 256->1024 +res", 64 * 14 * 14, 256, 1024, True),
         ("r50 l4 512->2048 +res", 64 * 7 * 7, 512, 2048, True)]
# larger tiles than the tactic's list, to see whether they pay
EXTRA = [(128, 256, 64, 4, 8), (256, 128, 64, 4, 8), (128, 256, 128, 3, 8), (256, 128, 128, 3, 8)]


def tops(ops: float, t_ms: float) -> float:
    return ops / (t_ms * 1e-3) / 1e12


def main() -> None:
    ap = parser(__doc__, out="wgmma-probe.json")
    args = ap.parse_args()
    banner()
    rows = []
    for label, m, k, n, has_res in GEMMS:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randint(-100, 100, (m, k), device="cuda", dtype=torch.int8, generator=g)
        w = torch.randint(-100, 100, (n, k), device="cuda", dtype=torch.int8, generator=g)
        scale = torch.full((n,), 1e-4, device="cuda")
        bias = torch.randn(n, device="cuda", generator=g)
        res = torch.randint(-100, 100, (m, n), device="cuda", dtype=torch.int8, generator=g) if has_res else None
        kw = dict(residual=res, res_scale=0.01 if has_res else None, out_scale=0.05, activation="relu")
        a16, w16 = a.half(), w.half()
        row = {"shape": label, "M": m, "K": k, "N": n, "ops": 2 * m * k * n,
               "fp16_cublas": graph_ms(lambda: F.linear(a16, w16)), "int_mm": graph_ms(lambda: torch._int_mm(a, w.t()))}
        row["tma"] = best([(str(c), lambda c=c: int8_gemm_tma.matmul(a, w, scale, bias, config=c, **kw))
                           for c in int8_gemm_tma.configs(m, n, k, SMEM)])
        cfgs = wg.configs(m, n, k, SMEM) + [dict(zip(wg.CONFIG_KEYS, t)) for t in EXTRA]
        row["wgmma"] = best([(str(c), lambda c=c: wg.matmul(a, w, scale, bias, config=c, **kw)) for c in cfgs])
        row["stream"] = best([(str(c), lambda c=c: wg.matmul(a, w, scale, bias, config=c, **kw))
                              for c in wg.stream_configs(n, k, SMEM, has_res)]) if k <= wg.STREAM_K else None
        row["wgmma_equal"] = bool(torch.equal(int8_gemm_tma.matmul(a, w, scale, bias, config=int8_gemm_tma.configs(
            m, n, k, SMEM)[0], **kw), wg.matmul(a, w, scale, bias, config=cfgs[0], **kw)))
        rows.append(row)
        o = row["ops"]
        print(f"{label:24} TOP/s fp16 {tops(o, row['fp16_cublas']):6.0f}  int_mm {tops(o, row['int_mm']):6.0f}  "
              f"tma {tops(o, row['tma'][0]):6.0f} ({row['tma'][0] * 1e3:.1f} us)  "
              f"wgmma {tops(o, row['wgmma'][0]):6.0f} "
              f"({row['wgmma'][0] * 1e3:.1f} us) {row['wgmma'][1]} equal {row['wgmma_equal']}"
              + (f"  stream {tops(o, row['stream'][0]):6.0f} ({row['stream'][0] * 1e3:.1f} us) {row['stream'][1]}"
                 if row["stream"] else ""), flush=True)
    for label, n, c, hw, co in CONVS3:
        x8 = torch.randint(-100, 100, (n, c, hw, hw), device="cuda", dtype=torch.int8)
        x8 = x8.contiguous(memory_format=torch.channels_last)
        packed = int8_conv.pack_weight(torch.randint(-100, 100, (co, c, 3, 3), device="cuda", dtype=torch.int8))
        scale = torch.full((co,), 1e-4, device="cuda")
        bias = torch.randn(co, device="cuda")
        kw = dict(out_scale=0.05, activation="relu")
        row = {"shape": label, "ops": 2 * n * hw * hw * co * c * 9}
        row["conv"] = best([(str(cf), lambda cf=cf: int8_conv.conv2d(
            x8, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, config={q: cf[q] for q in int8_conv.CONFIG_KEYS},
            **kw)) for cf in int8_conv.configs(n * hw * hw, co, c, SMEM, 3)[:12]])
        row["wgmma"] = best([(str(cf), lambda cf=cf: wg.conv2d(x8, packed, scale, (3, 3), [1] * 4, (1, 1), bias,
                                                                config=cf, **kw))
                             for cf in wg.conv_configs(hw, hw, co, c, SMEM)])
        rows.append(row)
        o = row["ops"]
        print(f"{label:24} TOP/s conv {tops(o, row['conv'][0]):6.0f} ({row['conv'][0] * 1e3:.1f} us) {row['conv'][1]}  "
              f"wgmma {tops(o, row['wgmma'][0]):6.0f} ({row['wgmma'][0] * 1e3:.1f} us) {row['wgmma'][1]}", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
