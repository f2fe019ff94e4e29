"""On a Hopper GPU: ResNet-50 b64's 1x1 chains (a block's last conv with its residual, then the next block's first
conv) as one chain kernel (kernels/int8_gemm_chain.py) at each config, against the two streaming GEMMs at their
best configs; then bit-exactness of every chain config against the two GEMMs.

    python -m benchmarks.probes.gpu_chain_probe --out results.json
"""

from __future__ import annotations


import torch

from benchmarks.probes.harness import SMEM, best, graph_ms, parser, write_json
from kiln.kernels import int8_gemm_chain as chain, int8_gemm_wgmma as wg

SHAPES = {"layer1 conv3 -> conv1": (200704, 64, 256, 64), "layer1.2 conv3 -> layer2.0 conv1": (200704, 64, 256, 128),
          "layer2 conv3 -> conv1": (50176, 128, 512, 128)}


def main() -> None:
    ap = parser(__doc__)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    i8 = lambda *s: torch.randint(-100, 100, s, device="cuda", dtype=torch.int8, generator=g)  # noqa: E731
    rows = []
    for name, (m, k, n, n2) in SHAPES.items():
        a, w, r, w2 = i8(m, k), i8(n, k), i8(m, n), i8(n2, n)
        s, b, s2, b2 = (torch.rand(c, device="cuda", generator=g) * 1e-3 for c in (n, n, n2, n2))
        kw = dict(out_scale=0.05, activation="relu")
        y = torch.empty(m, n, dtype=torch.int8, device="cuda")
        cfgs1 = {str(c): c for c in wg.stream_configs(n, k, SMEM, True)}
        cfgs2 = {str(c): c for c in wg.stream_configs(n2, n, SMEM, False)}
        t1, l1, _ = best([(lb, lambda c=c: wg.matmul(a, w, s, b, r, res_scale=0.02, config=c, out=y, **kw))
                          for lb, c in cfgs1.items()])
        t2, l2, _ = best([(lb, lambda c=c: wg.matmul(y, w2, s2, b2, config=c, **kw)) for lb, c in cfgs2.items()])
        want_y = wg.matmul(a, w, s, b, r, res_scale=0.02, config=cfgs1[l1], **kw)
        want_z = wg.matmul(want_y, w2, s2, b2, config=cfgs2[l2], **kw)
        row = {"shape": name, "M": m, "K": k, "N": n, "N2": n2, "separate_ms": t1 + t2, "first": [t1, l1],
               "second": [t2, l2], "chain": []}
        for cfg in chain.configs(m, k, n, n2, SMEM, True):
            run = lambda cfg=cfg: chain.chain(a, w, s, b, r, w2, s2, b2, res_scale=0.02, out2_scale=0.05,  # noqa: E731
                                              activation2="relu", config=cfg, **kw)
            try:
                got_y, got_z = run()
                exact = bool(torch.equal(got_y, want_y) and torch.equal(got_z, want_z))
                row["chain"].append([graph_ms(run), cfg, exact])
            except Exception as e:  # noqa: BLE001 - report and go on
                row["chain"].append([None, cfg, f"{type(e).__name__}: {str(e)[:200]}"])
            print(name, row["chain"][-1], flush=True)
        timed = [c for c in row["chain"] if c[0] is not None]
        if timed:
            row["best_chain_ms"] = min(c[0] for c in timed)
        print(f"{name}: separate {t1 * 1e3:.1f} + {t2 * 1e3:.1f} = {(t1 + t2) * 1e3:.1f} us; chain best "
              f"{row.get('best_chain_ms', float('nan')) * 1e3:.1f} us", flush=True)
        rows.append(row)
    if args.out:
        write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
