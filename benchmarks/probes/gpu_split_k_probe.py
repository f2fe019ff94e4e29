"""Split-K in the Triton implicit-GEMM conv at ResNet-50's batch-1 shapes, where 7x7 and 14x14 outputs give a few
dozen tiles for 132 multiprocessors: every config the triton_conv tactic offers at level 3 (split-K among them)
beside cuDNN (torch's conv2d with bias, channels_last; the ReLU left out, so a lower bound of cudnn_fused_conv),
each timed as CUDA-graph replays.

    python -m benchmarks.probes.gpu_split_k_probe --out $OUT/split-k.json
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.probes.harness import banner, graph_ms, parser, write_json
from kiln.ir import DType
from kiln.tactics import registry
from kiln.tactics.spec import LayerSpec, ValueSpec
from kiln.target.device import Device

# label, C, H (= W), CO, kernel, stride
SHAPES = [("l4 3x3 512", 512, 7, 512, 3, 1), ("l4 1x1 2048>512", 2048, 7, 512, 1, 1),
          ("l4 1x1 512>2048", 512, 7, 2048, 1, 1), ("l3 3x3 256", 256, 14, 256, 3, 1),
          ("l3 1x1 1024>256", 1024, 14, 256, 1, 1), ("l3 1x1 256>1024", 256, 14, 1024, 1, 1),
          ("l2 3x3 128", 128, 28, 128, 3, 1), ("l4.0 3x3 s2", 512, 14, 512, 3, 2)]


def main() -> None:
    args = parser(__doc__, required=True).parse_args()
    banner()
    dev = Device("cuda", torch.cuda.get_device_name(), "cuda")
    tactic, rows = registry.get("triton_conv"), []
    for label, c, h, co, k, s in SHAPES:
        x = torch.randn(1, c, h, h, device="cuda").half().contiguous(memory_format=torch.channels_last)
        w = (torch.randn(co, c, k, k, device="cuda") * 0.02).half()
        b = torch.randn(co, device="cuda").half()
        p = k // 2
        want = F.relu(F.conv2d(x, w, b, s, p))
        oh = want.shape[2]
        attrs = {"kernel_shape": [k, k], "strides": [s, s], "dilations": [1, 1], "pads": [p] * 4, "group": 1,
                 "auto_pad": "NOTSET", "activation": "Relu", "activation_params": [], "residual": False}
        spec = LayerSpec("conv", "FusedConv", attrs,
                         (ValueSpec(DType.FLOAT16, tuple(x.shape)), ValueSpec(DType.FLOAT16, tuple(w.shape), w),
                          ValueSpec(DType.FLOAT16, (co,), b)), (ValueSpec(DType.FLOAT16, (1, co, oh, oh)),))
        row = {"shape": label, "cudnn_bias_only_us": graph_ms(lambda: F.conv2d(x, w, b, s, p)) * 1e3, "configs": []}
        for cfg in tactic.configs(spec, dev, 3):
            run = tactic.compile(spec, cfg, dev)
            err = (run([x, w, b])[0].float() - want.float()).abs().max().item()
            row["configs"].append({"config": cfg, "us": graph_ms(lambda: run([x, w, b])) * 1e3, "max_err": err})
        rows.append(row)
        best = min(row["configs"], key=lambda r: r["us"])
        unsplit = min((r for r in row["configs"] if "SPLIT_K" not in r["config"]), key=lambda r: r["us"])
        print(f"{label}: cudnn (bias only) {row['cudnn_bias_only_us']:.1f} us, triton unsplit {unsplit['us']:.1f}, "
              f"best {best['us']:.1f} "
              f"{ {k: v for k, v in best['config'].items() if k != 'layout'} } err {best['max_err']:.3g}", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
