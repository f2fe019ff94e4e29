"""On an H100: why ResNet-50's 64→256 1x1 convs (M = 200704) take 40-75 µs depending on the layer — the TMA
int8 GEMM timed as the autotuner times it, one factor changed at a time: the activation, the output scale
(values inside int8 or saturated), the operands' data (uniform, mostly zero), and the weight scale. Then what
the epilogue's activation costs at BERT-base b64's FFN1 (M 8192, K 768, N 3072). Writes JSON.

    python -m benchmarks.probes.gpu_epilogue_probe --out probe.json
"""

from __future__ import annotations


import torch

from benchmarks.probes.harness import autotuner_us, parser, write_json
from kiln.kernels import int8_gemm_tma

M, K, N = 64 * 56 * 56, 64, 256
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}
FFN_CONFIGS = [{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 5},
               {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4}]


def main() -> None:
    ap = parser(__doc__, out="epilogue-probe.json")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    uniform = torch.randint(-127, 128, (M, K), device="cuda", dtype=torch.int8, generator=g)
    sparse = torch.where(torch.rand(M, K, device="cuda", generator=g) < 0.5, 0, uniform)
    w = torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8, generator=g)
    bias = torch.randn(N, device="cuda", generator=g)
    res = torch.randint(-127, 128, (M, N), device="cuda", dtype=torch.int8, generator=g)
    rows = []
    cases = {  # label: (a, weight scale, out_scale, activation, residual)
        "relu, in range": (uniform, 1e-4, 0.05, "relu", None),
        "none, in range": (uniform, 1e-4, 0.05, "none", None),
        "none, saturated": (uniform, 1e-1, 0.05, "none", None),
        "relu, saturated": (uniform, 1e-1, 0.05, "relu", None),
        "none, tiny (zeros)": (uniform, 1e-9, 0.05, "none", None),
        "none, sparse a": (sparse, 1e-4, 0.05, "none", None),
        "relu, residual, in range": (uniform, 1e-4, 0.05, "relu", res),
        "relu, residual, saturated": (uniform, 1e-1, 0.05, "relu", res),
    }
    for label, (a, ws, out_scale, act, r) in cases.items():
        scale = torch.full((N,), ws, device="cuda")
        kw = dict(out_scale=out_scale, activation=act, config=CONFIG)
        if r is not None:
            kw |= dict(residual=r, res_scale=0.01)
        out = int8_gemm_tma.matmul(a, w, scale, bias, **kw)
        us = autotuner_us(lambda: int8_gemm_tma.matmul(a, w, scale, bias, **kw))
        row = {"case": label, "us": us, "out_zero": (out == 0).float().mean().item(),
               "out_saturated": (out.abs() == 127).float().mean().item()}
        rows.append(row)
        print(f"{label:28} {us:7.1f} µs  zeros {row['out_zero']:.2f}  saturated {row['out_saturated']:.2f}",
              flush=True)
    ffn = []
    m, k, n = 8192, 768, 3072
    a = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
    scale, bias = torch.full((n,), 1e-4, device="cuda"), torch.randn(n, device="cuda", generator=g)
    for act in ("none", "relu", "gelu_erf", "gelu_tanh"):
        for cfg in FFN_CONFIGS:
            kw = dict(out_scale=0.05, activation=act, config=cfg)
            us = autotuner_us(lambda: int8_gemm_tma.matmul(a, w, scale, bias, **kw))
            ffn.append({"activation": act, "config": cfg, "us": us})
            print(f"bert ffn1 {act:10} {us:7.1f} µs  {cfg}", flush=True)
    write_json(args.out, {"M": M, "K": K, "N": N, "config": CONFIG, "rows": rows, "bert_ffn1": ffn})


if __name__ == "__main__":
    main()
