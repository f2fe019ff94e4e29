"""On an H100: the TMA-fed int8 GEMM (kernels/int8_gemm_tma.py) against kiln's pointer-fed int8 GEMM and conv,
torch._int_mm (cuBLASLt) and the fp16 peer (cuDNN conv / cuBLAS GEMM), at ResNet-50 b64 1x1-conv and BERT-base
b64 GEMM shapes; every kernel requantizes to int8 (bias, ReLU), best of its configs. Writes JSON to --out.

    python -m benchmarks.probes.gpu_int8_tma_probe --out probe.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.probes.harness import CONVS3, SMEM, banner, best, graph_ms, parser, write_json
from kiln.kernels import int8_conv, int8_conv_tma, int8_gemm, int8_gemm_tma

# (label, M, K, N, conv spatial size or None)
SHAPES = [("r50 l1 1x1 64->256", 64 * 56 * 56, 64, 256, 56), ("r50 l1 1x1 256->64", 64 * 56 * 56, 256, 64, 56),
          ("r50 l2 1x1 512->128", 64 * 28 * 28, 512, 128, 28), ("r50 l2 1x1 128->512", 64 * 28 * 28, 128, 512, 28),
          ("r50 l3 1x1 1024->256", 64 * 14 * 14, 1024, 256, 14), ("r50 l3 1x1 256->1024", 64 * 14 * 14, 256, 1024, 14),
          ("r50 l4 1x1 2048->512", 64 * 7 * 7, 2048, 512, 7), ("r50 l4 1x1 512->2048", 64 * 7 * 7, 512, 2048, 7),
          ("bert qkv", 8192, 768, 2304, None), ("bert out", 8192, 768, 768, None),
          ("bert ffn1", 8192, 768, 3072, None), ("bert ffn2", 8192, 3072, 768, None)]


def main() -> None:
    ap = parser(__doc__, out="int8-tma-probe.json")
    ap.add_argument("--fast-div", action="store_true", help="requantize with the approximate division (timing only)")
    ap.add_argument("--convs-only", action="store_true", help="only the 3x3 convs")
    ap.add_argument("--r50-only", action="store_true", help="only ResNet-50's 1x1 convs")
    args = ap.parse_args()
    if args.fast_div:
        for mod in (int8_conv, int8_gemm, int8_gemm_tma):
            mod.INTERPRET = True  # the kernels take EXACT_DIV=not INTERPRET
    rows = []
    banner()
    for label, m, k, n, hw in [] if args.convs_only else [s for s in SHAPES if s[4] or not args.r50_only]:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randint(-100, 100, (m, k), device="cuda", dtype=torch.int8, generator=g)
        w = torch.randint(-100, 100, (n, k), device="cuda", dtype=torch.int8, generator=g)
        scale = torch.full((n,), 1e-4, device="cuda")
        bias = torch.randn(n, device="cuda", generator=g)
        a16, w16 = a.half(), w.half()
        row = {"shape": label, "M": m, "K": k, "N": n}
        if hw is not None:
            x16 = a16.view(m // (hw * hw), hw, hw, k).permute(0, 3, 1, 2)
            x16 = x16.contiguous(memory_format=torch.channels_last)
            w4 = w16.view(n, k, 1, 1).contiguous(memory_format=torch.channels_last)
            row["fp16_cudnn"] = graph_ms(
                lambda: torch.cudnn_convolution_relu(x16, w4, bias.half(), (1, 1), (0, 0), (1, 1), 1))
            x8 = a.view(m // (hw * hw), hw, hw, k).permute(0, 3, 1, 2)
            packed = int8_conv.pack_weight(w.view(n, k, 1, 1))
            row["kiln_conv"] = best([(str(c), lambda c=c: int8_conv.conv2d(
                x8, packed, scale, (1, 1), (1, 1), [0] * 4, (1, 1), bias, out_scale=0.05, activation="relu",
                config={key: c[key] for key in int8_conv.CONFIG_KEYS}))
                for c in int8_conv.configs(m, n, k, SMEM, 3)[:10]])
        else:
            row["fp16_cublas"] = graph_ms(lambda: F.gelu(F.linear(a16, w16, bias.half())))
        row["int_mm"] = graph_ms(lambda: torch._int_mm(a, w.t()))
        row["kiln_gemm"] = best([(str(c), lambda c=c: int8_gemm.matmul(
            a, w.t(), scale, bias, out_scale=0.05, activation="relu", config=c))
            for c in int8_gemm.configs(m, n, k, SMEM, 3)[:10]])
        row["tma_gemm"] = best([(str(c), lambda c=c: int8_gemm_tma.matmul(
            a, w, scale, bias, out_scale=0.05, activation="relu", config=c))
            for c in int8_gemm_tma.configs(m, n, k, SMEM)])
        if hw is not None and n > k:  # a bottleneck's last conv: an int8 residual (res_scale), three ways
            res = torch.randint(-100, 100, (m, n), device="cuda", dtype=torch.int8, generator=g)
            kw = dict(residual=res, res_scale=0.01, out_scale=0.05, activation="relu")
            tiles = int8_gemm_tma.configs(m, n, k, SMEM)[:4]
            for early in (False, True):
                row[f"tma_res{'_early' if early else ''}"] = best(
                    [(str(c), lambda c=c, early=early: int8_gemm_tma.matmul(
                    a, w, scale, bias, config=c, res_early=early, **kw)) for c in tiles])
            res4 = res.view(m // (hw * hw), hw, hw, n).permute(0, 3, 1, 2)
            row["conv_res"] = best([(str(c), lambda c=c: int8_conv.conv2d(
                x8, packed, scale, (1, 1), (1, 1), [0] * 4, (1, 1), bias, res4, res_scale=0.01, out_scale=0.05,
                activation="relu", config={key: c[key] for key in int8_conv.CONFIG_KEYS}))
                for c in int8_conv.configs(m, n, k, SMEM, 3)[:4]])
            want = int8_gemm.matmul(a, w.t(), scale, bias, **kw)
            row["res_early_equal"] = bool(torch.equal(want, int8_gemm_tma.matmul(a, w, scale, bias, config=tiles[0],
                                                                               res_early=True, **kw)))
            print(f"{label:24} residual: tma {row['tma_res'][0]:.4f} {row['tma_res'][1]}  early "
                  f"{row['tma_res_early'][0]:.4f} {row['tma_res_early'][1]}  conv {row['conv_res'][0]:.4f}  "
                  f"equal {row['res_early_equal']}", flush=True)
        ref = int8_gemm.matmul(a, w.t(), scale, bias, out_scale=0.05, activation="relu")
        cfg = int8_gemm_tma.configs(m, n, k, SMEM)[0]
        got = int8_gemm_tma.matmul(a, w, scale, bias, out_scale=0.05, activation="relu", config=cfg)
        row["tma_equal"] = bool(torch.equal(ref, got))
        row["ops"] = 2 * m * k * n
        rows.append(row)
        peer = row.get("fp16_cudnn", row.get("fp16_cublas"))
        print(f"{label:24} fp16 {peer:.4f}  int_mm {row['int_mm']:.4f}  kiln_conv {row.get('kiln_conv', [0])[0]:.4f}"
              f"  kiln_gemm {row['kiln_gemm'][0]:.4f}  tma {row['tma_gemm'][0]:.4f} {row['tma_gemm'][1]}"
              f"  equal {row['tma_equal']}", flush=True)
    for label, n, c, hw, co in CONVS3:
        x16 = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        w16 = torch.randn(co, c, 3, 3, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        b16 = torch.randn(co, device="cuda", dtype=torch.half)
        row = {"shape": label, "fp16_cudnn_relu": graph_ms(lambda: torch.cudnn_convolution_relu(
            x16, w16, b16, (1, 1), (1, 1), (1, 1), 1))}
        x8 = x16.clamp(-100, 100).to(torch.int8).contiguous(memory_format=torch.channels_last)
        packed = int8_conv.pack_weight(w16.clamp(-100, 100).to(torch.int8))
        scale = torch.full((co,), 1e-4, device="cuda")
        bias = b16.float()
        row["kiln_conv"] = best([(str(cf), lambda cf=cf: int8_conv.conv2d(
            x8, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, out_scale=0.05, activation="relu",
            config={key: cf[key] for key in int8_conv.CONFIG_KEYS}))
            for cf in int8_conv.configs(n * hw * hw, co, c, SMEM, 3)[:12]])
        row["kiln_conv_tma"] = best([(str(cf), lambda cf=cf: int8_conv_tma.conv2d(
            x8, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, out_scale=0.05, activation="relu",
            config={key: cf[key] for key in int8_conv_tma.CONFIG_KEYS}))
            for cf in int8_conv_tma.configs(hw, hw, co, c, SMEM)])
        want = int8_conv.conv2d(x8, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, out_scale=0.05,
                                activation="relu")
        cf = int8_conv_tma.configs(hw, hw, co, c, SMEM)[0]
        row["tma_equal"] = bool(torch.equal(want, int8_conv_tma.conv2d(
            x8, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, out_scale=0.05, activation="relu", config=cf)))
        row["ops"] = 2 * n * hw * hw * co * c * 9
        rows.append(row)
        print(f"{label:24} fp16 {row['fp16_cudnn_relu']:.4f}  kiln_conv {row['kiln_conv'][0]:.4f} {row['kiln_conv'][1]}"
              f"  tma {row['kiln_conv_tma'][0]:.4f} {row['kiln_conv_tma'][1]} equal {row['tma_equal']}", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
