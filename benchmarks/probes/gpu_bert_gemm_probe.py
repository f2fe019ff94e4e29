"""Where int8 BERT-base batch 64 x 128's GEMMs lose (M = 8192): each of its four GEMM shapes through the Gluon wgmma
GEMM (int8 out) and the Triton TMA GEMM (fp16 and int8 out), with and without the erf GELU epilogue, every config,
against cuBLAS fp16 and torch._int_mm on the same shapes. TOP/s = 2·M·N·K ÷ the graph-replayed time.

    python -m benchmarks.probes.gpu_bert_gemm_probe --out $OUT/bert-gemm.json
"""

from __future__ import annotations

import torch

from benchmarks.probes.harness import banner, best, graph_ms, parser, write_json
from kiln.kernels import int8_gemm_tma, int8_gemm_wgmma
from kiln.kernels.common import smem_limit
from kiln.target.device import detect

SHAPES = [("qkv", 2304, 768), ("attn-out", 768, 768), ("ffn1", 3072, 768), ("ffn2", 768, 3072)]  # (name, N, K)


def _lsb(q: torch.Tensor, v: torch.Tensor) -> int:
    """The largest int8 step between q and v requantized at 0.05 (half to even, clamped to ±127)."""
    want = torch.clamp(torch.round(v / 0.05), -127, 127)
    return int((q.float() - want).abs().max().item())


def main() -> None:
    ap = parser(__doc__, required=True)
    ap.add_argument("--m", type=int, default=8192)
    args = ap.parse_args()
    banner()
    smem = smem_limit(detect("cuda"))
    m, rows = args.m, []
    for name, n, k in SHAPES:
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
        scale = torch.full((n,), 1e-4, device="cuda")
        bias = torch.randn(n, device="cuda")
        tops = 2 * m * n * k / 1e9
        a16, w16 = a.half(), w.half()
        row = {"gemm": name, "m": m, "n": n, "k": k,
               "cublas_fp16_ms": graph_ms(lambda: a16 @ w16.t()),
               "int_mm_ms": graph_ms(lambda: torch._int_mm(a, w.t()))}
        acc = torch._int_mm(a, w.t()).float() * scale + bias
        gelu = torch.nn.functional.gelu(acc)
        row["lsb_off"] = {  # the fast erf's GELU against torch's, requantized at 0.05 (int8) and in fp16
            "wgmma_int8": _lsb(int8_gemm_wgmma.matmul(a, w, scale, bias, out_scale=0.05, activation="gelu_erf",
                                                      config=int8_gemm_wgmma.configs(m, n, k, smem)[0]), gelu),
            "tma_int8": _lsb(int8_gemm_tma.matmul(a, w, scale, bias, out_scale=0.05, activation="gelu_erf",
                                                  config=int8_gemm_tma.configs(m, n, k, smem)[0]), gelu),
            "tma_fp16_max_abs": (int8_gemm_tma.matmul(a, w, scale, bias, activation="gelu_erf",
                                                      out_dtype=torch.float16,
                                                      config=int8_gemm_tma.configs(m, n, k, smem)[0]).float()
                                 - gelu).abs().max().item()}
        print(f"{name}: GELU check {row['lsb_off']}", flush=True)
        for act in ("none", "gelu_erf"):
            row[f"wgmma_int8_{act}"] = best([(str(c), lambda c=c: int8_gemm_wgmma.matmul(
                a, w, scale, bias, out_scale=0.05, activation=act, config=c))
                for c in int8_gemm_wgmma.configs(m, n, k, smem)])
            for out in ("fp16", "int8"):
                row[f"tma_{out}_{act}"] = best([(str(c), lambda c=c: int8_gemm_tma.matmul(
                    a, w, scale, bias, out_scale=0.05 if out == "int8" else None, activation=act,
                    out_dtype=torch.float16, config=c)) for c in int8_gemm_tma.configs(m, n, k, smem)])
        rows.append(row)
        print(f"{name} N {n} K {k}: cublas fp16 {row['cublas_fp16_ms'] * 1e3:.1f} us "
              f"({tops / row['cublas_fp16_ms']:.0f} TF/s), _int_mm {row['int_mm_ms'] * 1e3:.1f} us", flush=True)
        for key, v in row.items():
            if isinstance(v, tuple):
                print(f"   {key}: {v[0] * 1e3:.1f} us ({tops / v[0]:.0f} TOP/s) {v[1]}", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
