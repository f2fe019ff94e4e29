"""On the CPU: can int8 ResNet-50 with random weights agree with fp32 on top-1 for >= 97 % of random images?

    PYTHONPATH=src:.:tests python -m benchmarks.probes.cpu_int8_resnet_margin --out DIR [--size 64] [--images 64]

Two models, both tests/models/vision.py's ResNet-50 (torchvision's layer structure; torchvision is not needed):
  tv-init   torchvision's init (kaiming-normal fan-out convs) and BatchNorm statistics calibrated on random images
            (benchmarks.models.realistic): the model the GPU benchmarks measure with torchvision present
  fallback  benchmarks.models.instantiate as it is without torchvision: PyTorch's default init, BatchNorm at its
            initial statistics (mean 0, var 1), i.e. not calibrated
Each is exported to ONNX and built by kiln on the CPU (fp32 reference, then --int8 with the entropy, minmax and
percentile calibrators, entropy + smooth_alpha 0.5 on tv-init) at --size px, calibrated on --calib-images random
N(0, 1) images and evaluated on --images other ones. Per image i of the fp32 logits L_i:
margin = (top1 - top2) / std(L_i); int8 noise = std(L8_i - L_i) / std(L_i); a flip needs the top-2 gap's error
(about sqrt(2) noise) to exceed the margin, so predicted agreement = mean Phi(margin / (sqrt(2) noise)). On tv-init
(entropy), each quantizable layer's error alone in int8 (kiln.accuracy.int8_layers, the code of `debug precision
--precision int8`), then the agreement with the k worst layers float. Writes DIR/int8-resnet50-margin-cpu.json.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import kiln
from benchmarks.models import SPECS, instantiate, realistic
from benchmarks.probes.harness import facts, parser
from kiln.accuracy.int8_layers import Int8Search
from kiln.accuracy.metrics import Tolerance
from tests.models.export import export
from tests.models.vision import ResNet50

CALIBRATORS = ("entropy", "minmax", "percentile")
KS = (0, 1, 2, 4, 8, 16)
TARGET = 0.97


def tv_init(size: int) -> torch.nn.Module:
    """vision.ResNet50 with torchvision's init and BatchNorm statistics calibrated on random images."""
    torch.manual_seed(0)
    model = ResNet50()
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return realistic(model, size)


def phi(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def q(a: np.ndarray) -> dict:
    """Quantiles of `a`."""
    return {f"p{p}": float(np.percentile(a, p)) for p in (3, 5, 10, 25, 50, 75)}


def margins(ref: np.ndarray) -> dict:
    """The fp32 logits' per-image margin (top1 - top2, in units of the row's std) and how image-dependent they are."""
    s = ref.std(1)
    top = np.sort(ref, 1)
    m = (top[:, -1] - top[:, -2]) / s
    return {"margin": m, "std": s, "quantiles": q(m), "distinct_top1": int(len(set(ref.argmax(1).tolist()))),
            "image_dependent_variance": float(ref.var(0).mean() / ref.var(1).mean())}


def noise_analysis(ref: np.ndarray, got: np.ndarray, mg: dict) -> dict:
    """int8 output noise vs the fp32 margin: flips measured and predicted."""
    e = (got - ref) / mg["std"][:, None]
    noise = e.std(1)
    i = np.arange(len(ref))
    order = np.argsort(ref, 1)
    t1, t2 = order[:, -1], order[:, -2]
    gap_err = e[i, t1] - e[i, t2]
    m = mg["margin"]
    predicted = float(phi(m / (math.sqrt(2) * np.maximum(noise, 1e-12))).mean())
    # the relative noise sigma (same for every image) at which predicted agreement would be TARGET
    lo, hi = 1e-6, 10.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if phi(m / (math.sqrt(2) * mid)).mean() > TARGET else (lo, mid)
    return {"agreement": float((ref.argmax(1) == got.argmax(1)).mean()), "predicted_agreement": predicted,
            "noise": q(noise), "noise_mean": float(noise.mean()),
            "share_margin_below_sqrt2_noise": float((m < math.sqrt(2) * noise).mean()),
            "share_top2_gap_error_exceeds_margin": float((-gap_err > m).mean()),
            "noise_for_97pct": lo, "cosine_for_97pct_approx": 1 / math.sqrt(1 + lo * lo)}


def input_noise(fp32, feeds: dict, ref: np.ndarray, mg: dict) -> dict:
    """The fp32 engine's sensitivity: its logits with Gaussian noise of relative std r added to the input images
    (r = 0.009: int8 rounding of a N(0, 1) input with amax 4; 1.4e-4: fp16 rounding), against the clean logits."""
    out, g = {}, np.random.default_rng(7)
    x = feeds["input"]
    ctx = fp32.create_context()
    for r in (0.009, 1e-3, 1.4e-4):
        got = np.asarray(ctx.run({"input": (x + r * x.std() * g.standard_normal(x.shape)).astype(np.float32)})
                         ["logits"])
        cos = float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref))
        out[f"{r:g}"] = {"cosine": cos} | noise_analysis(ref, got, mg)
    return out


def summary(err) -> dict:
    return {"cosine": err.cosine, "max_rel": err.max_rel, "top1_agreement": err.top1}


def one_model(name: str, module: torch.nn.Module, source: str, args, tmp: Path, per_layer: bool, log) -> dict:
    path = export(module, (torch.randn(2, 3, args.size, args.size),), tmp / f"{name}.onnx", dynamo=False,
                  input_names=["input"], output_names=["logits"],
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    g = torch.Generator().manual_seed(1)
    calib = tmp / f"{name}-calib.npy"
    np.save(calib, torch.randn(args.calib_images, 3, args.size, args.size, generator=g).numpy())
    feeds = {"input": torch.randn(args.images, 3, args.size, args.size, generator=g).numpy()}
    t0 = time.perf_counter()
    fp32 = kiln.build(path, kiln.BuildConfig(device="cpu"))
    tol = Tolerance(0.0, 0.0, 0.999)
    out: dict = {"source": source, "calibrators": {}}
    mg = None
    for cal in CALIBRATORS + (("entropy+smooth0.5",) if args.smooth and per_layer else ()):
        smooth = 0.5 if "smooth" in cal else 0.0
        config = kiln.BuildConfig(device="cpu", int8=True, calib=str(calib), calibrator=cal.split("+")[0],
                                  smooth_alpha=smooth, calib_cache=None if smooth else str(tmp / f"{name}-{cal}.json"))
        search = Int8Search(path, config, fp32, [feeds], tol, log)
        if mg is None:
            ref = search.reference["logits"]
            mg = margins(ref)
            out["fp32"] = {"margin": mg["quantiles"], "distinct_top1": mg["distinct_top1"],
                           "image_dependent_variance": mg["image_dependent_variance"],
                           "share_margin_below": {str(t): float((mg["margin"] < t).mean())
                                                  for t in (0.01, 0.02, 0.05, 0.1, 0.2)}}
            out["fp32_input_noise"] = input_noise(fp32, feeds, ref, mg)
            log(f"{name} fp32 with input noise: " + ", ".join(f"r={r}: cosine {v['cosine']:.4f} top-1 "
                                                               f"{v['agreement']:.3f}"
                                                               for r, v in out["fp32_input_noise"].items()))
        all_int8 = search.error("(all int8)", "", [])
        out["calibrators"][cal] = summary(all_int8) | noise_analysis(ref, search.values[frozenset()]["logits"], mg)
        log(f"{name} {cal}: cosine {all_int8.cosine:.5f}, top-1 {all_int8.top1:.3f}")
        if cal != "entropy" or not per_layer:
            continue
        record = search.engines[frozenset()]
        cands = [n for n, r in record["layers"].items() if r["precision"] != "float"]
        errors = []
        for i, layer in enumerate(cands):
            errors.append(search.error(layer, record["layers"][layer]["kind"], [c for c in cands if c != layer]))
            log(f"  layer {i + 1}/{len(cands)} {layer}: cosine {errors[-1].cosine:.6f}")
        errors.sort(key=lambda e: (e.cosine, -e.max_rel))
        out["per_layer_entropy"] = [{"layer": e.name, "kind": e.kind} | summary(e) for e in errors]
        worst = [e.name for e in errors]
        out["k_worst_float_entropy"] = {}
        for k in KS:
            err = search.error(f"{k} worst float", "", worst[:k])
            out["k_worst_float_entropy"][str(k)] = summary(err) | {
                "agreement_check": noise_analysis(ref, search.values[frozenset(worst[:k])]["logits"], mg)["agreement"]}
            log(f"  {k} worst float: cosine {err.cosine:.5f}, top-1 {err.top1:.3f}")
    out["seconds"] = time.perf_counter() - t0
    return out


def control(args, tmp: Path, log) -> dict:
    """tv-init at --control-size: fp32 margins and the fp32 engine's sensitivity to input noise (no int8)."""
    size = args.control_size
    path = export(tv_init(size), (torch.randn(2, 3, size, size),), tmp / "control.onnx", dynamo=False,
                  input_names=["input"], output_names=["logits"],
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    feeds = {"input": torch.randn(args.images, 3, size, size, generator=torch.Generator().manual_seed(2)).numpy()}
    fp32 = kiln.build(path, kiln.BuildConfig(device="cpu"))
    ref = np.asarray(fp32.create_context().run(feeds)["logits"])
    mg = margins(ref)
    out = {"size": size, "margin": mg["quantiles"], "distinct_top1": mg["distinct_top1"],
           "fp32_input_noise": input_noise(fp32, feeds, ref, mg)}
    log(f"control {size} px: " + ", ".join(f"r={r}: cosine {v['cosine']:.4f} top-1 {v['agreement']:.3f}"
                                          for r, v in out["fp32_input_noise"].items()))
    return out


def main() -> None:
    ap = parser(__doc__, required=True, out_help="folder for int8-resnet50-margin-cpu.json")
    ap.add_argument("--size", type=int, default=64, help="image side in px")
    ap.add_argument("--images", type=int, default=64, help="random evaluation images")
    ap.add_argument("--calib-images", type=int, default=64, help="random calibration images")
    ap.add_argument("--no-smooth", dest="smooth", action="store_false", help="skip entropy + smooth_alpha 0.5")
    ap.add_argument("--skip-fallback", action="store_true", help="only the tv-init model")
    ap.add_argument("--control-size", type=int, default=112, help="also the fp32 margins and input-noise control of "
                    "tv-init at this size (0: skip)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log = lambda line: print(f"[{time.perf_counter() - t0:6.0f} s] {line}", flush=True)  # noqa: E731
    result = facts("cpu") | {"args": {k: str(v) for k, v in vars(args).items()}, "target_top1_agreement": TARGET,
                             "models": {}}
    with tempfile.TemporaryDirectory(prefix="kiln-margin-") as tmp:
        result["models"]["tv-init"] = one_model("tv-init", tv_init(args.size),
                                                "tests/models/vision.py ResNet50, torchvision init, BN calibrated "
                                                "(benchmarks.models.realistic)", args, Path(tmp), True, log)
        if args.control_size:
            result["tv_init_fp32_control"] = control(args, Path(tmp), log)
        if not args.skip_fallback:
            made = instantiate(SPECS["resnet50"], args.size)
            result["models"]["fallback"] = one_model("fallback", made.module, f"{made.source}; {made.fallback}",
                                                     args, Path(tmp), False, log)
    result["seconds"] = time.perf_counter() - t0
    file = args.out / "int8-resnet50-margin-cpu.json"
    file.write_text(json.dumps(result, indent=1, default=str))
    log(f"wrote {file}")


if __name__ == "__main__":
    main()
