"""The TMA-fed fp16 GEMM (kernels/gemm_tma.py) against cuBLASLt at BERT-base's and MiniLM's GEMM shapes (batch 64
and 1 at sequence 128), every config, plain, persistent and warp-specialized; FFN1 with its GELU epilogue on both
sides (cuBLASLt's GELU_BIAS). TFLOP/s = 2·M·N·K ÷ the graph-replayed time.

    python -m benchmarks.probes.gpu_gemm_tma_probe --out $OUT/gemm-tma.json
"""

from __future__ import annotations

import torch

from benchmarks.probes.harness import banner, graph_ms, parser, write_json
from kiln.kernels import gemm_tma
from kiln.kernels.common import smem_limit
from kiln.tactics.common import linear
from kiln.target.device import detect

# (name, N, K, GELU): BERT-base (hidden 768), MiniLM-L6 (hidden 384)
SHAPES = [("bert qkv", 2304, 768, False), ("bert attn-out", 768, 768, False), ("bert ffn1", 3072, 768, True),
          ("bert ffn2", 768, 3072, False), ("minilm qkv", 1152, 384, False), ("minilm ffn1", 1536, 384, True),
          ("minilm ffn2", 384, 1536, False)]


def main() -> None:
    ap = parser(__doc__, required=True)
    ap.add_argument("--rows", default="8192,128", help="M values (batch × sequence)")
    args = ap.parse_args()
    banner()
    smem = smem_limit(detect("cuda"))
    rows = []
    for m in (int(v) for v in args.rows.split(",")):
        for name, n, k, gelu in SHAPES:
            a = torch.randn(m, k, device="cuda").half()
            w = (torch.randn(n, k, device="cuda") / k ** 0.5).half()
            b = torch.randn(n, device="cuda").half()
            out = torch.empty(m * n * 2, device="cuda", dtype=torch.uint8)  # a byte buffer, as the engine gives
            tflop = 2 * m * n * k / 1e9
            want = linear(a, w, b, None, gelu=gelu)
            cublas = graph_ms(lambda: linear(a, w, b, out, gelu=gelu))
            row = {"gemm": name, "m": m, "n": n, "k": k, "gelu": gelu, "cublaslt_ms": cublas, "configs": []}
            cfgs = gemm_tma.configs(m, n, k, smem)
            cfgs += [dict(c, warp_specialize=True) for c in cfgs if c.get("persistent")]
            for cfg in cfgs:
                def call(cfg=cfg):
                    return gemm_tma.matmul(a, w, b, activation="gelu_erf" if gelu else "none", config=cfg, out=out)
                try:
                    err = (call().float() - want.float()).abs().max().item()
                    row["configs"].append({"config": cfg, "ms": graph_ms(call), "max_abs_err": err})
                except Exception as e:  # noqa: BLE001 - a config that does not compile is recorded, not fatal
                    row["configs"].append({"config": cfg, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            ok = [c for c in row["configs"] if "ms" in c]
            top = min(ok, key=lambda c: c["ms"]) if ok else None
            rows.append(row)
            print(f"M {m:5d} {name:14s} cuBLASLt {cublas * 1e3:7.1f} µs {tflop / cublas:6.0f} TFLOP/s | TMA best "
                  + (f"{top['ms'] * 1e3:7.1f} µs {tflop / top['ms']:6.0f} TFLOP/s err {top['max_abs_err']:.3g} "
                     f"{top['config']}" if top else "none ran")
                  + f" | {sum('error' in c for c in row['configs'])} failed", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
