"""Attention kernels at the suite's shapes: kiln's Triton flash kernel (every config; and the previous version when
benchmarks/probes/_old_attention.py holds a copy of it) beside torch SDPA's backends, on Q, K, V read as the head
split of one projection output (strided, as in an engine) with BERT's key-padding mask where the model has one.

    python -m benchmarks.probes.gpu_attention_ab --out DIR

Writes DIR/attention-ab.json; prints per shape the best ms (CUDA graph replays) and TFLOP/s of each contender.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.probes.harness import SMEM, best, graph_ms, parser, write_json
from kiln.kernels import attention

# (label, batch, heads, seq, head dim, key-padding mask)
SHAPES = [("bert 32x512", 32, 12, 512, 64, True), ("bert 64x128", 64, 12, 128, 64, True),
          ("minilm 64x128", 64, 12, 128, 32, True), ("vit 64x197", 64, 12, 197, 64, False),
          ("bert 1x128", 1, 12, 128, 64, True), ("vit 1x197", 1, 12, 197, 64, False)]
BACKENDS = {"sdpa efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa flash": SDPBackend.FLASH_ATTENTION}


def inputs(b: int, h: int, s: int, d: int, masked: bool):
    """Q, K, V as (B, H, S, D) views of one (B, S, 3·H·D) projection, and an additive (B, 1, 1, S) mask."""
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.float16, generator=g)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    if not masked:
        return q, k, v, None
    keep = torch.rand(b, 1, 1, s, device="cuda", generator=g) > 0.1
    return q, k, v, torch.where(keep, 0.0, -10000.0).to(torch.float16)


def tuner_inputs(q, k, v, mask):
    """What the autotuner timed on before stop 36: contiguous Q, Kᵀ (B, H, D, S), V and a full random boolean mask."""
    b, h, s, d = q.shape
    kt = k.transpose(-1, -2).contiguous()
    full = torch.rand(b, 1, s, s, device="cuda") < 0.9 if mask is not None else None
    return q.contiguous(), kt.transpose(-1, -2), v.contiguous(), full


def per_config(module, q, k, v, mask) -> dict:
    """Graph-replay ms of every config."""
    out = {}
    for label, fn in kernel_fns(module, q, k, v, mask):
        try:
            out[label] = round(graph_ms(fn), 5)
        except Exception as e:  # noqa: BLE001 - a config that does not fit is skipped
            out[label] = f"{type(e).__name__}"
    return out


def kernel_fns(module, q, k, v, mask) -> list:
    b, h, s, d = q.shape
    cfgs = module.configs(s, d, d, 2, SMEM, 2)
    return [(f"{c}", (lambda c=c: module.attention(q, k, v, mask, config=c, heads_inner=True))) for c in cfgs]


def main() -> None:
    args = parser(__doc__, required=True).parse_args()
    try:
        old = importlib.import_module("benchmarks.probes._old_attention")
    except ImportError:
        old = None
    rows = []
    for label, b, h, s, d, masked in SHAPES:
        q, k, v, mask = inputs(b, h, s, d, masked)
        flops = 4 * b * h * s * s * d
        row = {"shape": label, "gflop": flops / 1e9}
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()
        got = attention.attention(q, k, v, mask).float().view(ref.shape)
        row["max_diff"] = (got - ref).abs().max().item()
        contenders = {"kiln triton": kernel_fns(attention, q, k, v, mask)}
        if old is not None:
            contenders["kiln triton (before)"] = kernel_fns(old, q, k, v, mask)
        for name, backend in BACKENDS.items():
            def call(backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            contenders[name] = [(name, call)]
        row["configs"] = per_config(attention, q, k, v, mask)
        row["configs_tuner_inputs"] = per_config(attention, *tuner_inputs(q, k, v, mask))
        for name, fns in contenders.items():
            ms, cfg, ran = best(fns)
            row[name] = {"ms": ms, "config": cfg, "ran": ran, "tflops": flops / ms / 1e9 if ran else None}
        rows.append(row)
        print(f"\n{label} (max diff vs SDPA {row['max_diff']:.2e})", flush=True)
        for name in contenders:
            r = row[name]
            if r["ran"]:
                print(f"  {name:22s} {r['ms']:.4f} ms  {r['tflops']:6.1f} TFLOP/s  {r['config']}", flush=True)
        for label, ms in row["configs"].items():
            print(f"    {ms}  (tuner's inputs {row['configs_tuner_inputs'].get(label)})  {label}", flush=True)
        write_json(args.out / "attention-ab.json", {"rows": rows})


if __name__ == "__main__":
    main()
