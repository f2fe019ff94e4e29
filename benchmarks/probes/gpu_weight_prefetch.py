"""Weight prefetch under PDL for few-row GEMMs (kernels/gemm.py `prefetch`): each program asks L2 for its weight
rows while the previous kernel runs, then waits for it. An encoder's GEMMs at batch 1 (BERT-base, MiniLM: 128 rows)
chained with kiln's add+LayerNorm kernels in one CUDA graph, distinct weights per layer (so from HBM), timed three
ways: cuBLASLt (torch.addmm, the GELU as its epilogue), the Triton GEMM, the Triton GEMM with the prefetch. Each
GEMM shape's Triton config is the fastest of its first candidates in a graph of its layers' GEMMs, per variant.

    python -m benchmarks.probes.gpu_weight_prefetch --out DIR [--models bert,minilm] [--candidates 8]

Writes DIR/weight-prefetch.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.probes.harness import graph_ms, write_json
from kiln.kernels import gemm
from kiln.kernels.common import SplitScratch, sm_count, smem_limit
from kiln.kernels.layernorm import add_layer_norm

MODELS = {"bert": (768, 3072, 12), "minilm": (384, 1536, 6)}  # hidden, FFN width, layers
ROWS = 128  # batch 1 at sequence 128


def _layers(hidden: int, ffn: int, layers: int) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(0)

    def w(k, n):
        return (torch.randn(k, n, device="cuda", generator=g) / k ** 0.5).half()

    def v(n, scale=0.02):
        return (torch.randn(n, device="cuda", generator=g) * scale).half()

    return [{"qkv": (w(hidden, 3 * hidden), v(3 * hidden)), "o": (w(hidden, hidden), v(hidden)),
             "up": (w(hidden, ffn), v(ffn)), "down": (w(ffn, hidden), v(hidden)),
             "ln1": (v(hidden, 1.0) + 1, v(hidden)), "ln2": (v(hidden, 1.0) + 1, v(hidden))} for _ in range(layers)]


ACT = {"qkv": "none", "o": "none", "up": "gelu_erf", "down": "none"}


def _cublas(x, wb, act):
    w, b = wb
    return torch._addmm_activation(b, x, w, use_gelu=True) if act != "none" else torch.addmm(b, x, w)


def _triton(configs: dict, prefetch: bool):
    scratch: dict = {}

    def run(x, wb, act, key):
        w, b = wb
        return gemm.matmul(x, w, b, activation=act, config=configs[key[0]], prefetch=prefetch,
                           scratch=scratch.setdefault(key, SplitScratch()))
    return run


def _chain(layers: list[dict], x: torch.Tensor, gemm_fn, hidden: int):
    """The encoder's GEMM and add+LayerNorm kernels (the attention left out: its input is Q's columns)."""
    def run():
        h = x
        for i, layer in enumerate(layers):
            qkv = gemm_fn(h, layer["qkv"], "none", ("qkv", i))
            o = gemm_fn(qkv[:, :hidden], layer["o"], "none", ("o", i))
            h1, _ = add_layer_norm(o, h, *layer["ln1"], 1e-12, want_sum=False)
            u = gemm_fn(h1, layer["up"], "gelu_erf", ("up", i))
            d = gemm_fn(u, layer["down"], "none", ("down", i))
            h, _ = add_layer_norm(d, h1, *layer["ln2"], 1e-12, want_sum=False)
        return h
    return run


def _pick(layers, x_for, name: str, prefetch: bool, candidates: int) -> tuple[dict, list]:
    """The fastest of the first `candidates` configs for GEMM `name`: every layer's GEMM of that shape in one graph."""
    k, n = layers[0][name][0].shape
    device = torch.device("cuda")
    cfgs = gemm.configs(ROWS, n, k, 2, smem_limit(device), 2, sm_count(device))[:candidates]
    x = x_for(k)
    timed = []
    for cfg in cfgs:
        scratch = [SplitScratch() for _ in layers]

        def run(cfg=cfg, scratch=scratch):
            for layer, s in zip(layers, scratch):
                gemm.matmul(x, *layer[name], activation=ACT[name], config=cfg, prefetch=prefetch, scratch=s)
        try:
            timed.append((graph_ms(run, repeat=2) * 1e3 / len(layers), cfg))
        except Exception as e:  # noqa: BLE001 - a config that does not compile is skipped
            print(f"    {name} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    timed.sort(key=lambda t: t[0])
    return timed[0][1], [{"us": round(t, 3), "config": c} for t, c in timed]


def probe_model(model: str, candidates: int) -> dict:
    hidden, ffn, n_layers = MODELS[model]
    layers = _layers(hidden, ffn, n_layers)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(ROWS, hidden, device="cuda", generator=g).half()
    xs = {hidden: x, ffn: torch.randn(ROWS, ffn, device="cuda", generator=g).half()}
    row: dict = {"model": model, "rows": ROWS, "hidden": hidden, "ffn": ffn, "layers": n_layers, "per_gemm_us": {}}
    configs = {}
    for prefetch in (False, True):
        configs[prefetch] = {}
        for name in ACT:
            cfg, timed = _pick(layers, xs.__getitem__, name, prefetch, candidates)
            configs[prefetch][name] = cfg
            row["per_gemm_us"][f"{name}{'+prefetch' if prefetch else ''}"] = timed
            print(f"  {model} {name} prefetch={prefetch}: best {timed[0]['us']:.2f} us {cfg}", flush=True)
    # cuBLASLt a GEMM, the same graphs of one shape's layers
    for name in ACT:
        def run(name=name):
            for layer in layers:
                _cublas(xs[layer[name][0].shape[0]], layer[name], ACT[name])
        row["per_gemm_us"][f"{name}:cublaslt"] = round(graph_ms(run, repeat=2) * 1e3 / n_layers, 3)
    ways = {"cublaslt": lambda h, wb, act, key: _cublas(h, wb, act),
            "triton": _triton(configs[False], False), "triton+prefetch": _triton(configs[True], True),
            "triton(prefetch configs, off)": _triton(configs[True], False)}
    outs, row["chain_us"] = {}, {}
    for label, fn in ways.items():
        chain = _chain(layers, x, fn, hidden)
        outs[label] = chain().float()
        row["chain_us"][label] = round(graph_ms(chain, repeat=1) * 1e3, 2)
    for label in ways:  # alternate a second round: the order of the first may favour one
        row["chain_us"][label + " (again)"] = round(graph_ms(_chain(layers, x, ways[label], hidden), repeat=1) * 1e3, 2)
    row["max_abs_diff_vs_cublaslt"] = {k: float((v - outs["cublaslt"]).abs().max()) for k, v in outs.items()}
    row["prefetch_bit_equal"] = bool(torch.equal(outs["triton(prefetch configs, off)"], outs["triton+prefetch"]))
    print(f"{model}: chain µs {row['chain_us']}; prefetch bit-equal {row['prefetch_bit_equal']}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="bert,minilm")
    ap.add_argument("--candidates", type=int, default=8)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start, rows = time.perf_counter(), []
    for model in args.models.split(","):
        rows.append(probe_model(model, args.candidates))
        write_json(args.out / "weight-prefetch.json", {"rows": rows, "seconds": round(time.perf_counter() - start)})


if __name__ == "__main__":
    main()
