"""On a Hopper GPU: ResNet-50 b64's costliest int8 kernels, each at the config the autotuner picked on 2026-11-24
(results/int8-end-to-end-12-…json), run once between cudaProfilerStart/Stop so Nsight Compute profiles just
those launches; `--time` times them instead (CUDA graph replays), for durations outside the profiler.

    ncu --profile-from-start off --section SpeedOfLight ... python -m benchmarks.probes.gpu_ncu_probe
    python -m benchmarks.probes.gpu_ncu_probe --time
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.probes.harness import graph_ms
from kiln.kernels import int8_conv, int8_conv_halo as halo, int8_conv_pair as pair
from kiln.kernels import int8_gemm_wgmma as wg, pool, quantize, space_to_depth


def _i8(g, *shape):
    t = torch.randint(-100, 100, shape, device="cuda", dtype=torch.int8, generator=g)
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def cases() -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    scales = {co: torch.rand(co, device="cuda", generator=g) * 1e-4 + 1e-5 for co in (64, 128, 256, 512)}
    biases = {co: torch.randn(co, device="cuda", generator=g) for co in (64, 128, 256, 512)}
    sc, b = scales.__getitem__, biases.__getitem__
    kw = dict(out_scale=0.05, activation="relu")
    out = {}
    # stem: space-to-depth of the quantized image, then the halo 4x1 conv over S's row view
    img = _i8(g, 64, 3, 224, 224).contiguous()
    w_stem = int8_conv.pack_weight(space_to_depth.row_weight(space_to_depth.weight(_i8(g, 64, 3, 7, 7), 16)))
    out["s2d"] = lambda: space_to_depth.space_to_depth(img, (3, 3), (115, 115), 16)
    image = torch.randn(64, 3, 224, 224, device="cuda", generator=g)
    out["input_quantize"] = lambda: quantize.quantize(image, 0.02)
    s = space_to_depth.space_to_depth(img, (3, 3), (115, 115), 16)
    rows = space_to_depth.rows(s, 4)
    stem_cfg = {"BH": 16, "BW": 8, "BLOCK_N": 64, "BLOCK_K": 64, "STAGES": 3, "num_warps": 4, "stream": 3}
    out["stem_halo"] = lambda: halo.conv2d(rows, w_stem, sc(64), (4, 1), [0] * 4, b(64), config=stem_cfg, **kw)
    p = _i8(g, 64, 64, 112, 112)
    out["maxpool"] = lambda: pool.max_pool2d(p, (3, 3), (2, 2), (1, 1), (1, 1), (56, 56),
                                             config={"BLOCK_P": 128, "BLOCK_C": 64, "num_warps": 8})
    # layer 1 conv3 with residual: GEMM 200704 x 64 -> 256
    a1, w1, r1 = _i8(g, 200704, 64), _i8(g, 256, 64), _i8(g, 200704, 256)
    out["l1_conv3"] = lambda: wg.matmul(a1, w1, sc(256), b(256), r1, res_scale=0.02, config={
        "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "stream": 2}, **kw)
    # layer 2 pair: conv3 128 -> 512 at 28x28 + downsample 256 -> 512 from 56x56 / 2
    x, x2 = _i8(g, 64, 128, 28, 28), _i8(g, 64, 256, 56, 56)[:, :, ::2, ::2]
    wa, wb = _i8(g, 512, 128), _i8(g, 512, 256)
    for tile in [(8, 8, 128, 4), (4, 32, 128, 8), (4, 32, 64, 4)]:
        cfg = {"BH": tile[0], "BW": tile[1], "BLOCK_N": tile[2], "BLOCK_K": 64, "STAGES": 4,
               "num_warps": tile[3], "stream": 2 if tile[2] == 128 else 3}
        out[f"l2_pair_{tile[0]}x{tile[1]}x{tile[2]}"] = lambda cfg=cfg: pair.conv_pair(
            x, wa, sc(512), b(512), x2, wb, sc(512), b(512), config=cfg, **kw)
    # the pairs' channel blocks: 64-byte against 128-byte box rows (layers 2 and 3)
    x3p, x3s = _i8(g, 64, 256, 14, 14), _i8(g, 64, 512, 28, 28)[:, :, ::2, ::2]
    w3a, w3b = _i8(g, 1024, 256), _i8(g, 1024, 512)
    s1024, b1024 = torch.rand(1024, device="cuda", generator=g) * 1e-4, torch.randn(1024, device="cuda", generator=g)
    for bk in (64, 128):
        for tile in [(4, 32, 128, 8), (4, 32, 64, 4), (8, 8, 128, 4)]:
            cfg = {"BH": tile[0], "BW": tile[1], "BLOCK_N": tile[2], "BLOCK_K": bk, "STAGES": 4,
                   "num_warps": tile[3], "stream": 1}
            out[f"pairbk_l2_{bk}_{tile}"] = lambda cfg=cfg: pair.conv_pair(
                x, wa, sc(512), b(512), x2, wb, sc(512), b(512), config=cfg, **kw)
        for tile in [(16, 16, 64, 8), (8, 16, 64, 4), (8, 16, 128, 8)]:
            cfg = {"BH": tile[0], "BW": tile[1], "BLOCK_N": tile[2], "BLOCK_K": bk, "STAGES": 4 if bk == 64 else 3,
                   "num_warps": tile[3], "stream": 1}
            out[f"pairbk_l3_{bk}_{tile}"] = lambda cfg=cfg: pair.conv_pair(
                x3p, w3a, s1024, b1024, x3s, w3b, s1024, b1024, config=cfg, **kw)
    # layer 3 3x3 256 at 14x14: halo (resident weights) and the pointer conv
    x3, w3 = _i8(g, 64, 256, 14, 14), int8_conv.pack_weight(_i8(g, 256, 256, 3, 3))
    out["l3_halo"] = lambda: halo.conv2d(x3, w3, sc(256), (3, 3), [1] * 4, b(256), config={
        "BH": 8, "BW": 16, "BLOCK_N": 64, "BLOCK_K": 64, "STAGES": 2, "num_warps": 4, "stream": 1}, **kw)
    out["l3_pointer"] = lambda: int8_conv.conv2d(x3, w3, sc(256), (3, 3), (1, 1), [1] * 4, (1, 1), b(256), config={
        "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}, **kw)
    # layer 4 3x3 512 at 7x7: per-tap TMA wgmma conv
    x4, w4 = _i8(g, 64, 512, 7, 7), int8_conv.pack_weight(_i8(g, 512, 512, 3, 3))
    out["l4_wgmma"] = lambda: wg.conv2d(x4, w4, sc(512), (3, 3), [1] * 4, (1, 1), b(512), config={
        "BH": 8, "BW": 8, "BLOCK_N": 128, "BLOCK_K": 64, "STAGES": 4, "num_warps": 4}, **kw)
    # layer 2 stride-2 3x3 on the pointer conv
    x5, w5 = _i8(g, 64, 128, 56, 56), int8_conv.pack_weight(_i8(g, 128, 128, 3, 3))
    out["l2_s2_pointer"] = lambda: int8_conv.conv2d(x5, w5, sc(128), (3, 3), (2, 2), [1] * 4, (1, 1), b(128), config={
        "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4}, **kw)
    return out


def check() -> None:
    """Space-to-depth and the int8 MaxPool on the GPU against torch, bit for bit."""
    import torch.nn.functional as F
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(-128, 128, (4, 3, 37, 30), device="cuda", dtype=torch.int8, generator=g)
    s = space_to_depth.space_to_depth(x, (3, 3), (20, 16))
    xp = F.pad(x.float(), (3, 40, 3, 40))
    ok = True
    for c in range(4):
        for dy in range(2):
            for dx in range(2):
                want = xp[:, c, dy::2, dx::2][:, :20, :16] if c < 3 else torch.zeros(4, 20, 16, device="cuda")
                ok &= torch.equal(s[:, space_to_depth.channel(c, dy, dx)].float(), want)
    print(f"check space_to_depth: {ok}", flush=True)
    p = _i8(g, 8, 64, 112, 112)
    want = F.max_pool2d(p.float(), 3, 2, 1).to(torch.int8)
    for cfg in pool.CONFIGS:
        got = pool.max_pool2d(p, (3, 3), (2, 2), (1, 1), (1, 1), (56, 56), config=cfg)
        print(f"check maxpool {cfg}: {torch.equal(got, want)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--check", action="store_true", help="compare space-to-depth and MaxPool with torch first")
    ap.add_argument("--only", default="", help="comma-separated case-name prefixes")
    args = ap.parse_args()
    fns = {k: f for k, f in cases().items() if not args.only or k.startswith(tuple(args.only.split(",")))}
    for name, fn in fns.items():
        try:
            fn()
            fn()
        except Exception as e:  # noqa: BLE001 - a probe reports every failure and goes on
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            fns[name] = None
    torch.cuda.synchronize()
    if args.check:
        check()
    if args.time:
        for name, fn in fns.items():
            if fn is not None:
                print(f"time {name:24} {graph_ms(fn) * 1e3:8.1f} us", flush=True)
        return
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns.values():
        if fn is not None:
            fn()
            torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
