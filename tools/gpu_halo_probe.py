"""On an H100: the halo-box 3x3 int8 conv (kernels/int8_conv_halo.py) against the pointer-fed implicit-GEMM conv and
the per-tap TMA conv (kernels/int8_gemm_wgmma.py) at ResNet-50 b64's 3x3 shapes, every halo tile timed and checked
bit for bit against kernels/int8_conv.py (bias, ReLU, int8 out; a ragged map with a residual too).

    PYTHONPATH=src:tools python tools/gpu_halo_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_int8_tma_probe import CONVS3, SMEM, best, ms  # noqa: E402
from kiln.kernels import int8_conv, int8_conv_halo as halo, int8_gemm_wgmma as wg  # noqa: E402


def tops(ops: float, t_ms: float) -> float:
    return ops / (t_ms * 1e-3) / 1e12


def _case(n, c, h, w, co, res, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randint(-100, 100, (n, c, h, w), device="cuda", dtype=torch.int8, generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    packed = int8_conv.pack_weight(torch.randint(-100, 100, (co, c, 3, 3), device="cuda", dtype=torch.int8,
                                                 generator=g))
    scale = torch.rand(co, device="cuda", generator=g) * 1e-4 + 1e-5
    bias = torch.randn(co, device="cuda", generator=g)
    kw = dict(out_scale=0.05, activation="relu")
    if res:
        r = torch.randint(-100, 100, (n, co, h, w), device="cuda", dtype=torch.int8, generator=g)
        kw |= dict(residual=r.contiguous(memory_format=torch.channels_last), res_scale=0.01)
    return x, packed, scale, bias, kw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="halo-probe.json")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    rows, checks = [], []
    for n, c, h, w, co, res in [(3, 64, 13, 11, 48, True), (2, 128, 28, 28, 128, False), (2, 64, 9, 20, 64, False)]:
        x, packed, scale, bias, kw = _case(n, c, h, w, co, res, seed=1)
        want = int8_conv.conv2d(x, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, **kw)
        for cfg in halo.configs(3, h, w, co, c, SMEM, res) or [{"BH": 8, "BW": 16, "BLOCK_N": 64, "BLOCK_K": 64,
                                                                 "STAGES": 2, "num_warps": 4, "stream": 1}]:
            try:
                got = halo.conv2d(x, packed, scale, (3, 3), [1] * 4, bias, config=cfg, **kw)
                ok = bool(torch.equal(got, want))
                detail = "" if ok else f"{(got != want).sum().item()} of {want.numel()} differ"
            except Exception as e:  # noqa: BLE001
                ok, detail = False, f"{type(e).__name__}: {str(e)[:200]}"
            checks.append({"case": [n, c, h, w, co, res], "config": str(cfg), "equal": ok, "detail": detail})
            print(f"check {n}x{c}x{h}x{w}->{co} res={res} {cfg}: {ok} {detail}", flush=True)
    for label, n, c, hw, co in CONVS3[:3]:
        x, packed, scale, bias, kw = _case(n, c, hw, hw, co, False)
        row = {"shape": label, "ops": 2 * n * hw * hw * co * c * 9}
        row["conv"] = best([(str(cf), lambda cf=cf: int8_conv.conv2d(
            x, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, config={q: cf[q] for q in int8_conv.CONFIG_KEYS},
            **kw)) for cf in int8_conv.configs(n * hw * hw, co, c, SMEM, 3)[:6]])
        row["wgmma"] = best([(str(cf), lambda cf=cf: wg.conv2d(x, packed, scale, (3, 3), [1] * 4, (1, 1), bias,
                                                                config=cf, **kw))
                             for cf in wg.conv_configs(hw, hw, co, c, SMEM)[:3]])
        row["halo_all"] = []
        for cf in halo.configs(3, hw, hw, co, c, SMEM, False):
            for variant in ({}, {"stream": 2}, {"STAGES": 3}):
                cfg = cf | variant
                if cfg != cf and cfg in [cf]:
                    continue
                t = best([(str(cfg), lambda cfg=cfg: halo.conv2d(x, packed, scale, (3, 3), [1] * 4, bias,
                                                                 config=cfg, **kw))])
                row["halo_all"].append([t[0], str(cfg)])
                print(f"  {label} halo {cfg}: {t[0] * 1e3:.1f} us", flush=True)
        row["halo"] = min(row["halo_all"]) if row["halo_all"] else None
        rows.append(row)
        o = row["ops"]
        print(f"{label:18} conv {row['conv'][0] * 1e3:.1f} us ({tops(o, row['conv'][0]):.0f} TOP/s) "
              f"wgmma {row['wgmma'][0] * 1e3:.1f} us  halo "
              + (f"{row['halo'][0] * 1e3:.1f} us ({tops(o, row['halo'][0]):.0f} TOP/s) {row['halo'][1]}"
                 if row["halo"] else "none"), flush=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "checks": checks, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
