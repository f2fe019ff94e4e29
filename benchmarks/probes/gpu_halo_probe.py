"""On an H100: the halo-box 3x3 int8 conv (kernels/int8_conv_halo.py) against the pointer-fed implicit-GEMM conv and
the per-tap TMA conv (kernels/int8_gemm_wgmma.py) at ResNet-50 b64's 3x3 shapes, every halo tile timed and checked
bit for bit against kernels/int8_conv.py (bias, ReLU, int8 out; a ragged map with a residual too).

    python -m benchmarks.probes.gpu_halo_probe --out probe.json
"""

from __future__ import annotations


import torch

from benchmarks.probes.harness import CONVS3, SMEM, banner, best, parser, write_json
from kiln.kernels import int8_conv, int8_conv_halo as halo, int8_gemm_wgmma as wg


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


def _stem() -> dict:
    """ResNet-50 b64's stem (7x7 / 2 on 3 channels, ReLU, int8 out) through the space-to-depth tactics: the pointer
    4x1 conv against the halo conv over S's overlapping rows; each tactic's best config, bits compared."""
    from kiln.ir import DType
    from kiln.tactics import registry
    from kiln.tactics.spec import LayerSpec, ValueSpec
    from kiln.target import detect
    g = torch.Generator().manual_seed(0)
    attrs = {"group": 1, "auto_pad": "NOTSET", "dilations": [1, 1], "kernel_shape": [7, 7], "pads": [3] * 4,
             "strides": [2, 2], "x_scale": 0.1, "out_scale": 0.5, "activation": "Relu", "activation_params": []}
    x = torch.randint(-100, 100, (64, 3, 224, 224), dtype=torch.int8, generator=g)
    inputs = [x, torch.randint(-100, 100, (64, 3, 7, 7), dtype=torch.int8, generator=g),
              torch.rand(64, generator=g) * 1e-4 + 1e-5, torch.randn(64, generator=g)]
    args = [t.cuda() for t in inputs]
    vals = tuple(ValueSpec(DType.from_torch(t.dtype), tuple(t.shape), t if 0 < i < 4 else None)
                 for i, t in enumerate(args))
    spec = LayerSpec("stem", "QuantConv", attrs, vals, (ValueSpec(DType.INT8, (64, 64, 112, 112)),))
    gpu = detect("cuda")
    row = {"shape": "r50 stem 7x7/2", "ops": 2 * 64 * 112 * 112 * 64 * 147}
    outs = {}
    for name in ("triton_int8_conv_s2d", "triton_int8_conv_s2d_halo"):
        t = registry.get(name)
        why = t.supports(spec, gpu)
        if why:
            row[name] = why
            print(f"stem {name}: refused: {why}", flush=True)
            continue
        fns = [(str(c), (lambda run=t.compile(spec, c, gpu): run(args))) for c in t.configs(spec, gpu, 3)]
        row[name] = best(fns)
        outs[name] = dict(fns)[row[name][1]]()[0]
        print(f"stem {name}: {row[name][0] * 1e3:.1f} us {row[name][1]}", flush=True)
    if len(outs) == 2:
        row["equal"] = bool(torch.equal(*outs.values()))
        print(f"stem equal: {row['equal']}", flush=True)
    return row


def main() -> None:
    ap = parser(__doc__, out="halo-probe.json")
    args = ap.parse_args()
    banner()
    rows, checks = [], []
    for n, c, h, w, co, res in [(3, 64, 13, 11, 48, True), (2, 128, 28, 28, 128, False), (2, 64, 9, 20, 64, False)]:
        x, packed, scale, bias, kw = _case(n, c, h, w, co, res, seed=1)
        want = int8_conv.conv2d(x, packed, scale, (3, 3), (1, 1), [1] * 4, (1, 1), bias, **kw)
        for cfg in halo.configs((3, 3), h, w, co, c, SMEM, res) or [{"BH": 8, "BW": 16, "BLOCK_N": 64, "BLOCK_K": 64,
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
        for cf in halo.configs((3, 3), hw, hw, co, c, SMEM, False):
            for variant in ({}, {"stream": 2}, {"STAGES": 3}):
                cfg = cf | variant
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
    rows.append(_stem())
    write_json(args.out, {"checks": checks, "rows": rows})


if __name__ == "__main__":
    main()
