"""Issue 25's GPU check: CUDA engines survive save → load (plan format 2, header checksum, manifest validation,
first-call check) with the same outputs and the same steady-state time as before saving.

    python -m benchmarks.probes.gpu_plan_roundtrip --out DIR
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import kiln
from benchmarks.probes.harness import parser, wall_ms, write_json
from tests.models.export import export
from tests.models.text import LastHidden, tiny_bert
from tests.models.vision import ResNet50, randomize_bn


def roundtrip(name, onnx_path, feeds, config, folder) -> dict:
    """Build, save, load; outputs of both engines and their steady-state times."""
    start = time.perf_counter()
    built = kiln.build(onnx_path, config)
    build_s = time.perf_counter() - start
    plan = built.save(folder / f"{name}.plan")
    loaded = kiln.load(plan)  # strict policy: the header must match this device and versions
    a, b = built.create_context(), loaded.create_context()
    first_a, first_b = a.run(feeds), b.run(feeds)
    same = all(np.array_equal(np.asarray(first_a[k]), np.asarray(first_b[k])) for k in first_a)
    row = {"model": name, "build_s": round(build_s, 1), "plan_bytes": plan.stat().st_size, "outputs_equal": same,
            "built_ms": wall_ms(lambda: a.run(feeds)), "loaded_ms": wall_ms(lambda: b.run(feeds)),
            "load_notes": loaded.build_info.get("load_notes", [])}
    print(row, flush=True)
    return row


def main() -> None:
    ap = parser(__doc__, required=True, out_help="folder for plan-roundtrip.json")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        g = np.random.default_rng(0)
        bert = export(LastHidden(tiny_bert(), pooled=False), (torch.zeros(2, 16, dtype=torch.long),) * 3,
                      folder / "bert.onnx", dynamo=False, input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["y"], dynamic_axes={n: {0: "b"} for n in ["input_ids", "attention_mask",
                                                                              "token_type_ids", "y"]})
        feeds = {"input_ids": g.integers(0, 500, (4, 16)), "attention_mask": np.ones((4, 16), np.int64),
                 "token_type_ids": np.zeros((4, 16), np.int64)}
        rows.append(roundtrip("tiny-bert-fp16-dynamic-batch", bert, feeds, kiln.BuildConfig(
            device=args.device, fp16=True, profiles=[{k: ((1, 16), (4, 16), (8, 16)) for k in feeds}]), folder))
        cnn = export(randomize_bn(ResNet50(num_classes=10, layers=(1, 1, 1, 1))), (torch.randn(1, 3, 64, 64),),
                     folder / "cnn.onnx", dynamo=False, input_names=["x"], output_names=["y"])
        x = {"x": g.normal(size=(1, 3, 64, 64)).astype(np.float32)}
        rows.append(roundtrip("resnet-mini-fp16", cnn, x, kiln.BuildConfig(device=args.device, fp16=True), folder))
        np.savez(folder / "calib.npz", x=g.normal(size=(8, 3, 64, 64)).astype(np.float32))
        rows.append(roundtrip("resnet-mini-int8", cnn, x, kiln.BuildConfig(device=args.device, int8=True, fp16=True,
                                                                           calib=str(folder / "calib.npz")), folder))
    write_json(args.out / "plan-roundtrip.json", {"rows": rows}, device=args.device)


if __name__ == "__main__":
    main()
