"""Do batch-1 GEMMs, which wait on their weights' HBM loads, run faster when a side stream prefetches the next
layer's weights into L2 while the current one runs? BERT-base's 48 encoder GEMMs at 128 rows (cuBLASLt, each layer
its own weights: 170 MB, three times L2) captured in one CUDA graph, plain and with a `prefetch.global.L2` kernel
for the weights one or two GEMMs ahead forked onto a second stream.

    python -m benchmarks.probes.gpu_l2_prefetch_probe --out $OUT/prefetch.json
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmarks.probes.harness import banner, parser, write_json
from kiln.util.timing import measure

LAYER = [(768, 2304, False), (768, 768, False), (768, 3072, True), (3072, 768, False)]  # k, n, GELU
LINES = 1024  # 128-byte lines a program prefetches


@triton.jit
def _prefetch_kernel(base, n_lines, sink, LINES_PER_PROG: tl.constexpr):
    offs = tl.program_id(0) * LINES_PER_PROG + tl.arange(0, LINES_PER_PROG)
    addrs = base + tl.minimum(offs, n_lines - 1).to(tl.int64) * 128
    done = tl.inline_asm_elementwise("{ prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }", "=r,l", [addrs],
                                     dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sink + tl.program_id(0), tl.sum(done))


def prefetch(t: torch.Tensor, sink: torch.Tensor) -> None:
    lines = triton.cdiv(t.numel() * t.element_size(), 128)
    _prefetch_kernel[(triton.cdiv(lines, LINES),)](t.view(torch.uint8).view(-1), lines, sink, LINES_PER_PROG=LINES)


def graph_us(body) -> float:
    body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    return measure(g.replay, device="cuda", warmup=5, iterations=40).median * 1e3


def main() -> None:
    args = parser(__doc__, required=True).parse_args()
    facts = banner()
    gemms = []
    for _ in range(12):
        for k, n, gelu in LAYER:
            gemms.append((torch.randn(128, k, device="cuda").half(), (torch.randn(k, n, device="cuda") * 0.02).half(),
                          torch.randn(n, device="cuda").half(), gelu))
    sink = torch.zeros(4096, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()

    def one(i):
        a, w, b, gelu = gemms[i]
        return torch._addmm_activation(b, a, w, use_gelu=True) if gelu else torch.addmm(b, a, w)

    def plain():
        for i in range(len(gemms)):
            one(i)

    def ahead(dist: int):
        def body():
            main = torch.cuda.current_stream()
            for i in range(len(gemms)):
                if i + dist < len(gemms):
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        prefetch(gemms[i + dist][1], sink)
                one(i)
            main.wait_stream(side)
        return body

    def prefetch_only():
        for a, w, b, gelu in gemms:
            prefetch(w, sink)

    res = {}
    for rnd in range(2):
        for name, body in (("plain", plain), ("prefetch 1 ahead", ahead(1)), ("prefetch 2 ahead", ahead(2)),
                           ("prefetch kernels alone", prefetch_only)):
            us = graph_us(body)
            res.setdefault(name, []).append(us)
            print(f"round {rnd}: {name}: {us:.1f} us for 48 GEMMs ({us / 48:.2f} a GEMM)", flush=True)
    write_json(args.out, {"facts": facts, "total_us": res, "weights_mb": sum(g[1].numel() * 2 for g in gemms) / 2**20})


if __name__ == "__main__":
    main()
