"""On a Hopper GPU: ResNet-50 b64's stride-2 1x1 downsample convs (bias + int8 residual + ReLU) on the pointer conv
against the TMA convs reading the subsample view x[:, :, ::2, ::2] in place, and the stem's 3x3 / 2 MaxPool
(int8, NHWC) for every config, optionally against an older kernels/pool.py (`--old-pool FILE`). Checks bits.

    python -m benchmarks.probes.gpu_stride2_probe --out probe.json [--old-pool old_pool.py]
"""

from __future__ import annotations

import importlib.util

import torch

from benchmarks.probes.harness import SMEM, graph_ms, parser, write_json
from kiln.kernels import int8_conv, int8_conv_tma, int8_gemm_wgmma as wg, pool

DOWNSAMPLES = [(256, 56, 512), (512, 28, 1024), (1024, 14, 2048)]  # C, H (= W), CO of layers 2-4's first block


def _i8(g, *shape):
    t = torch.randint(-100, 100, shape, device="cuda", dtype=torch.int8, generator=g)
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def downsample_rows(g) -> list[dict]:
    rows = []
    for c, h, co in DOWNSAMPLES:
        x, r = _i8(g, 64, c, h, h), _i8(g, 64, co, h // 2, h // 2)
        packed = int8_conv.pack_weight(_i8(g, co, c, 1, 1))
        scale, bias = torch.full((co,), 1e-4, device="cuda"), torch.randn(co, device="cuda")
        kw = dict(residual=r, res_scale=0.02, out_scale=0.05, activation="relu")
        want = int8_conv.conv2d(x, packed, scale, (1, 1), (2, 2), [0] * 4, (1, 1), bias, **kw)
        sub = x[:, :, ::2, ::2]
        fns = {"pointer conv": lambda: int8_conv.conv2d(x, packed, scale, (1, 1), (2, 2), [0] * 4, (1, 1), bias,
                                                        **kw)}
        for cfg in wg.conv_configs(h // 2, h // 2, co, c, SMEM):
            fns[f"wgmma conv {cfg}"] = lambda cfg=cfg: wg.conv2d(sub, packed, scale, (1, 1), [0] * 4, (1, 1), bias,
                                                                 config=cfg, **kw)
        for cfg in int8_conv_tma.configs(h // 2, h // 2, co, c, SMEM):
            fns[f"tma conv {cfg}"] = lambda cfg=cfg: int8_conv_tma.conv2d(sub, packed, scale, (1, 1), (1, 1),
                                                                          [0] * 4, (1, 1), bias, config=cfg, **kw)
        for label, fn in fns.items():
            try:
                exact = bool(torch.equal(fn(), want))
                us = graph_ms(fn) * 1e3
            except Exception as e:  # noqa: BLE001 - a probe reports every failure and goes on
                rows.append({"shape": [c, h, co], "kernel": label, "error": repr(e)[:300]})
                print(f"downsample {c}x{h}->{co} {label[:90]}: {e!r:.200}", flush=True)
                continue
            rows.append({"shape": [c, h, co], "kernel": label, "us": us, "exact": exact})
            print(f"downsample {c}x{h}->{co} {label[:90]:90} {us:7.1f} us exact {exact}", flush=True)
    return rows


def pool_rows(g, old_pool: str | None) -> list[dict]:
    x = _i8(g, 64, 64, 112, 112)
    want = torch.nn.functional.max_pool2d(x.float(), 3, 2, 1).to(torch.int8)
    kernels = {"pool": pool}
    if old_pool:
        spec = importlib.util.spec_from_file_location("old_pool", old_pool)
        kernels["old pool"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernels["old pool"])
    rows = []
    for name, mod in kernels.items():
        for cfg in mod.CONFIGS:
            fn = lambda mod=mod, cfg=cfg: mod.max_pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1), (56, 56), cfg)  # noqa: E731
            exact = bool(torch.equal(fn(), want))
            us = graph_ms(fn) * 1e3
            rows.append({"kernel": f"{name} {cfg}", "us": us, "exact": exact})
            print(f"maxpool {name} {cfg} {us:7.1f} us exact {exact}", flush=True)
    xh = x.half()
    us = graph_ms(lambda: torch.nn.functional.max_pool2d(xh, 3, 2, 1)) * 1e3
    rows.append({"kernel": "torch fp16 max_pool2d", "us": us})
    print(f"maxpool torch fp16 {us:7.1f} us", flush=True)
    return rows


def main() -> None:
    ap = parser(__doc__, out="stride2-probe.json")
    ap.add_argument("--old-pool")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    out = {"pool": pool_rows(g, args.old_pool), "downsample": downsample_rows(g)}
    write_json(args.out, out)


if __name__ == "__main__":
    main()
