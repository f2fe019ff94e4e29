"""How much do BERT-base's and ViT-B/16's GEMMs leave on the table by running cuBLASLt's first heuristic (what
torch.addmm / F.linear do)? Every algorithm `cublasLtMatmulAlgoGetHeuristic` returns (up to 32) for each GEMM
with its bias (+ GELU) epilogue, timed as CUDA-graph replays beside torch's call, results checked.

    python -m benchmarks.probes.gpu_cublaslt_algos_probe --out $OUT/cublaslt-algos.json
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from benchmarks.probes.harness import banner, graph_ms, parser, write_json

# name, M, K, N, GELU
SHAPES = [("bert b64 qkv", 8192, 768, 2304, False), ("bert b64 out", 8192, 768, 768, False),
          ("bert b64 up", 8192, 768, 3072, True), ("bert b64 down", 8192, 3072, 768, False),
          ("vit b64 up", 12608, 768, 3072, True), ("vit b64 down", 12608, 3072, 768, False),
          ("minilm b64 up", 8192, 384, 1536, True), ("minilm b64 down", 8192, 1536, 384, False),
          ("bert b1 down", 128, 3072, 768, False), ("bert b1 qkv", 128, 768, 2304, False)]
R_16F, COMPUTE_32F, R_32F = 2, 68, 0
TRANSA, TRANSB, EPILOGUE, BIAS_POINTER = 3, 4, 7, 8
EPI_BIAS, EPI_GELU_BIAS = 4, 36
PREF_MAX_WORKSPACE = 1
WORKSPACE = 32 << 20


class Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _lib() -> ctypes.CDLL:
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # loads torch's cuBLASLt
    with open("/proc/self/maps") as f:
        path = next(line.split()[-1] for line in f if "libcublasLt.so" in line)
    return ctypes.CDLL(path)


LT = None


def ok(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: cublasStatus {rc}")


class Gemm:
    """D (M, N) = act(A (M, K) @ W (K, N) + bias), row-major, as cuBLASLt's column-major D^T = W^T A^T."""

    def __init__(self, handle, a, w, bias, gelu):
        m, k = a.shape
        n = w.shape[1]
        self.a, self.w, self.bias = a, w, bias
        self.d = torch.empty(m, n, dtype=a.dtype, device=a.device)
        self.ws = torch.empty(WORKSPACE, dtype=torch.uint8, device=a.device)
        self.handle = handle
        self.desc = ctypes.c_void_p()
        ok(LT.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, R_32F), "desc")
        op = ctypes.c_int(0)
        for attr in (TRANSA, TRANSB):
            ok(LT.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(op), ctypes.c_size_t(4)), "trans")
        epi = ctypes.c_uint32(EPI_GELU_BIAS if gelu else EPI_BIAS)
        ok(LT.cublasLtMatmulDescSetAttribute(self.desc, EPILOGUE, ctypes.byref(epi), ctypes.c_size_t(4)), "epilogue")
        ptr = ctypes.c_void_p(bias.data_ptr())
        ok(LT.cublasLtMatmulDescSetAttribute(self.desc, BIAS_POINTER, ctypes.byref(ptr), ctypes.c_size_t(8)), "bias")
        self.la, self.lb, self.ld = (self._layout(n, k, n), self._layout(k, m, k), self._layout(n, m, n))
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def _layout(rows, cols, ld):
        lay = ctypes.c_void_p()
        ok(LT.cublasLtMatrixLayoutCreate(ctypes.byref(lay), R_16F, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                         ctypes.c_int64(ld)), "layout")
        return lay

    def heuristics(self, count: int = 32) -> list[Heuristic]:
        pref = ctypes.c_void_p()
        ok(LT.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        size = ctypes.c_size_t(WORKSPACE)
        ok(LT.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(size), ctypes.c_size_t(8)),
           "pref ws")
        results, found = (Heuristic * count)(), ctypes.c_int(0)
        ok(LT.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.la, self.lb, self.ld, self.ld, pref, count,
                                             results, ctypes.byref(found)), "heuristic")
        return [results[i] for i in range(found.value) if results[i].state == 0]

    def run(self, h: Heuristic) -> torch.Tensor:
        ok(LT.cublasLtMatmul(self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(self.w.data_ptr()),
                             self.la, ctypes.c_void_p(self.a.data_ptr()), self.lb, ctypes.byref(self.beta),
                             ctypes.c_void_p(self.d.data_ptr()), self.ld, ctypes.c_void_p(self.d.data_ptr()), self.ld,
                             ctypes.byref(h.algo), ctypes.c_void_p(self.ws.data_ptr()), ctypes.c_size_t(WORKSPACE),
                             ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)), "matmul")
        return self.d


def graph_us(fn) -> float:
    return graph_ms(fn) * 1e3


def main() -> None:
    global LT
    args = parser(__doc__, required=True).parse_args()
    facts = banner()
    LT = _lib()
    handle = ctypes.c_void_p()
    ok(LT.cublasLtCreate(ctypes.byref(handle)), "create")
    rows = []
    for name, m, k, n, gelu in SHAPES:
        a = torch.randn(m, k, device="cuda").half()
        w = (torch.randn(k, n, device="cuda") * 0.03).half()
        b = torch.randn(n, device="cuda").half()
        want = a.float() @ w.float() + b.float()
        want = F.gelu(want, approximate="tanh") if gelu else want
        torch_us = graph_us((lambda: torch._addmm_activation(b, a, w, use_gelu=True)) if gelu
                            else (lambda: torch.addmm(b, a, w)))
        g = Gemm(handle, a, w, b, gelu)
        algos = []
        for i, h in enumerate(g.heuristics()):
            got = g.run(h).float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            algos.append({"rank": i, "us": graph_us(lambda h=h: g.run(h)), "err": err, "waves": h.waves,
                          "workspace": h.workspace, "algo": list(h.algo)})
        best = min(algos, key=lambda x: x["us"] if x["err"] < 1e-2 else 1e9)
        rows.append({"shape": name, "m": m, "k": k, "n": n, "gelu": gelu, "torch_us": torch_us, "algos": algos})
        print(f"{name}: torch {torch_us:.2f} us, heuristic 0 {algos[0]['us']:.2f} us, best {best['us']:.2f} us "
              f"(rank {best['rank']} of {len(algos)}; err {best['err']:.1e}), {algos[0]['us'] / best['us']:.3f}x",
              flush=True)
        write_json(args.out, {"facts": facts, "rows": rows})


if __name__ == "__main__":
    main()
