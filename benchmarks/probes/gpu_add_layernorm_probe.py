"""AddLayerNorm's Triton kernel at BERT-base batch 64 x 128 (8192 rows of 768, fp16), with and without the folded
int8 output, at every config the tactic offers (one row a program, and blocks of rows), against its bytes' floor
(a device-to-device copy's rate, same process).

    python -m benchmarks.probes.gpu_add_layernorm_probe --out $OUT/add-ln.json
"""

from __future__ import annotations

import torch

from benchmarks.probes.harness import banner, graph_ms, parser, write_json
from kiln.kernels import layernorm
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from kiln.ir import DType
from kiln.target.device import detect


def main() -> None:
    ap = parser(__doc__, required=True)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=768)
    args = ap.parse_args()
    banner()
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    gbps = 2 * big.numel() / graph_ms(lambda: big.clone()) / 1e6
    m, n = args.rows, args.width
    a, r = (torch.randn(m, n, device="cuda", dtype=torch.float16) for _ in range(2))
    w, b = torch.rand(n, device="cuda", dtype=torch.float16) + 0.5, torch.randn(n, device="cuda", dtype=torch.float16)
    v = ValueSpec(DType.FLOAT16, (m, n))
    spec = LayerSpec("ln", "AddLayerNorm", {"axis": -1, "epsilon": 1e-5},
                     (v, v, ValueSpec(DType.FLOAT16, (n,)), ValueSpec(DType.FLOAT16, (n,))), (v, None))
    configs = registry.get("triton_add_layernorm").configs(spec, detect("cuda"), 3)
    rows, base = [], None
    for quant in (False, True):
        moved = (4 * m * n * 2 + (m * n if quant else 0))  # a, r in; y out (+ int8 q); fp16
        floor = moved / gbps / 1e6
        for cfg in configs:
            kw = dict(q_scale=0.02) if quant else {}
            ms = graph_ms(lambda: layernorm.add_layer_norm(a, r, w, b, 1e-5, cfg, False, **kw))
            got = layernorm.add_layer_norm(a, r, w, b, 1e-5, cfg, False, **kw)
            if base is None or cfg is configs[0]:
                base = got
            same = all(torch.equal(x, z) for x, z in zip(got, base) if x is not None)
            rows.append({"quantized": quant, "config": cfg, "ms": ms, "floor_ms": floor, "same_as_first": same})
            print(f"add+LN q={quant} {cfg}: {ms * 1e3:.1f} us floor {floor * 1e3:.1f} same {same}", flush=True)
    write_json(args.out, {"copy_gbps": gbps, "rows": rows})


if __name__ == "__main__":
    main()
