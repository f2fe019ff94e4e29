"""On a Hopper GPU: ResNet-50 b64's layer-3/4 1x1 convs as int8 GEMMs through the Gluon kernels
(kernels/int8_gemm_wgmma.py: the persistent streaming one and the pipelined one) at their configs and at extra
tiles, timed by CUDA-graph replay, each checked bit for bit against the pointer GEMM.

    python -m benchmarks.probes.gpu_gemm1x1_probe --out results.json
"""

from __future__ import annotations

import itertools
import json

import torch

from benchmarks.probes.harness import SMEM, graph_ms, parser, write_json
from kiln.kernels import int8_gemm, int8_gemm_wgmma as wg

# (label, M, K, N, residual)
SHAPES = [("l3 conv1 1024->256", 12544, 1024, 256, False), ("l3 conv3 256->1024 +r", 12544, 256, 1024, True),
          ("l4 conv1 2048->512", 3136, 2048, 512, False), ("l4 conv3 512->2048 +r", 3136, 512, 2048, True),
          ("l4.0 conv1 1024->512", 12544, 1024, 512, False)]


def extra(m, n, k, res):
    """Streaming tiles at every programs-per-SM that fits, and pipelined tiles beyond the kernel's list."""
    out = []
    if k <= wg.STREAM_K:
        for (bm, bn, warps), stages in itertools.product([(64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 8)],
                                                         (2, 3, 4)):
            need = wg.stream_smem(bm, bn, k, stages, res)
            for per_sm in (1, 2, 3):
                if per_sm * (need + 1024) <= SMEM:
                    out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": min(k, 128), "STAGES": stages,
                                "num_warps": warps, "stream": per_sm})
    for bm, bn, bk, st, w in [(64, 128, 128, 3, 4), (64, 128, 128, 5, 4), (128, 128, 128, 4, 8),
                              (64, 64, 128, 4, 4), (128, 64, 128, 4, 4), (64, 256, 64, 4, 4)]:
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w})
    return out


def main() -> None:
    ap = parser(__doc__)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, m, k, n, res in SHAPES:
        a = torch.randint(-100, 100, (m, k), device="cuda", dtype=torch.int8, generator=g)
        w = torch.randint(-100, 100, (n, k), device="cuda", dtype=torch.int8, generator=g)
        s, b = (torch.rand(n, device="cuda", generator=g) * 1e-4 for _ in range(2))
        kw = dict(out_scale=0.05, activation="relu")
        if res:
            kw |= dict(residual=torch.randint(-100, 100, (m, n), device="cuda", dtype=torch.int8, generator=g),
                       res_scale=0.02)
        want = int8_gemm.matmul(a, w.t(), s, b, **kw)
        y = torch.empty(m, n, dtype=torch.int8, device="cuda")
        row = {"shape": label, "M": m, "K": k, "N": n, "residual": res, "runs": []}
        cfgs = wg.stream_configs(n, k, SMEM, res) + wg.configs(m, n, k, SMEM) + extra(m, n, k, res)
        seen = set()
        for cfg in cfgs:
            key = json.dumps(cfg, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            run = lambda cfg=cfg: wg.matmul(a, w, s, b, config=cfg, out=y, **kw)  # noqa: E731
            try:
                exact = bool(torch.equal(run(), want))
                row["runs"].append([graph_ms(run) * 1e3, cfg, exact])
            except Exception as e:  # noqa: BLE001 - report and go on
                row["runs"].append([None, cfg, f"{type(e).__name__}: {str(e)[:160]}"])
        timed = sorted((r[0], json.dumps(r[1])) for r in row["runs"] if r[0] is not None and r[2] is True)
        print(f"== {label}: {[(round(t, 1), c) for t, c in timed[:4]]}", flush=True)
        rows.append(row)
    if args.out:
        write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
