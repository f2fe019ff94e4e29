"""Make the demo models once (exported from torch into a cache folder), build them, check them, time them."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import kiln
from kiln.bench import LatencyStats, measure
from kiln.demo.models import TinyEncoder, TinyResNet, randomize_batchnorm
from kiln.errors import InternalError
from kiln.ir.dtype import to_numpy

VERSION = 1  # bump when a demo model changes: cached file names carry it, so stale exports are not reused
OPSET = 17
BENCH_SECONDS = 1.5
# kiln vs torch in fp32, summed in different orders: a few ulps. On CUDA, cuDNN convolutions default
# to TF32 (10-bit mantissa), hence about 1e-3 relative error per layer.
TOLERANCE = {"cpu": (1e-3, 1e-4), "cuda": (1e-2, 1e-2)}


@dataclass(frozen=True)
class Demo:
    """A demo model: how to make it and a batch of example input."""

    name: str
    make: Callable[[], torch.nn.Module]
    example: Callable[[torch.Generator], torch.Tensor]
    input_name: str
    output_name: str = "logits"


DEMOS = (
    Demo("resnet_tiny", lambda: randomize_batchnorm(TinyResNet()),
         lambda g: torch.randn(8, 3, 32, 32, generator=g), "image"),
    Demo("encoder_tiny", lambda: TinyEncoder().eval(),
         lambda g: torch.randint(0, 1000, (8, 32), generator=g), "ids"),
)


@dataclass
class DemoResult:
    """What one demo model did: where its plan is, how it compares with torch, how fast it ran."""

    name: str
    plan: Path
    device: str
    input_shape: tuple[int, ...]
    onnx_nodes: int
    layers: int
    build_seconds: float
    max_abs_diff: float
    stats: LatencyStats


def cache_dir() -> Path:
    """`$KILN_CACHE_DIR/demo`, else `$XDG_CACHE_HOME/kiln/demo`, else `~/.cache/kiln/demo`."""
    root = os.environ.get("KILN_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "demo"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln" / "demo"


def export(demo: Demo, folder: Path) -> tuple[Path, Path]:
    """The demo's .onnx file and its .npz reference (an input and torch's output for it), made on first use."""
    onnx_path, ref_path = folder / f"{demo.name}-v{VERSION}.onnx", folder / f"{demo.name}-v{VERSION}.npz"
    if onnx_path.is_file() and ref_path.is_file():
        return onnx_path, ref_path
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = demo.make()
    x = demo.example(torch.Generator().manual_seed(0))
    tmp_onnx, tmp_ref = (p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in (onnx_path, ref_path))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(tmp_onnx), dynamo=False, opset_version=OPSET,
                          input_names=[demo.input_name], output_names=[demo.output_name],
                          dynamic_axes={demo.input_name: {0: "batch"}, demo.output_name: {0: "batch"}})
        with open(tmp_ref, "wb") as f:
            np.savez(f, input=x.numpy(), output=model(x).numpy())
    os.replace(tmp_onnx, onnx_path)  # the reference last: a half-made cache is remade, never trusted
    os.replace(tmp_ref, ref_path)
    return onnx_path, ref_path


def run_one(demo: Demo, device: str, folder: Path, report: Callable[[str], None]) -> DemoResult:
    """Export (once), build for `device`, save the plan, compare with torch's output, time it."""
    report(f"{demo.name}: exporting from torch (first use only)")
    onnx_path, ref_path = export(demo, folder)
    with np.load(ref_path, allow_pickle=False) as ref:
        x, want = ref["input"], ref["output"]
    report(f"{demo.name}: building")
    engine = kiln.build(onnx_path, kiln.BuildConfig.with_shapes({demo.input_name: x.shape}, device=device))
    backend = engine.device.backend
    plan = engine.save(folder / f"{demo.name}-v{VERSION}-{backend}.plan")
    report(f"{demo.name}: checking against torch")
    ctx = engine.create_context()
    feeds = {demo.input_name: torch.from_numpy(x).to(engine.device.torch_device)}
    got = to_numpy(ctx.run(feeds)[demo.output_name])
    rtol, atol = TOLERANCE[backend]
    if got.shape != want.shape or got.dtype != want.dtype or not np.allclose(got, want, rtol, atol):
        raise InternalError(f"demo {demo.name}: the engine's output ({got.dtype}{list(got.shape)}) differs from "
                            f"torch's ({want.dtype}{list(want.shape)}) beyond rtol {rtol}, atol {atol}")
    report(f"{demo.name}: timing for {BENCH_SECONDS} s")
    stats = measure(lambda: ctx.run(feeds), device=engine.device.torch_device, warmup=3,
                    duration=BENCH_SECONDS, batch=x.shape[0])
    return DemoResult(demo.name, plan, f"{backend}: {engine.device.name}", x.shape,
                      engine.build_info["onnx_nodes"], engine.build_info["layers"],
                      engine.build_info["build_seconds"], float(np.max(np.abs(got - want))), stats)


def run_demo(device: str = "auto", report: Callable[[str], None] = lambda message: None) -> list[DemoResult]:
    """Every demo model, built for `device` (the best present by default)."""
    return [run_one(demo, device, cache_dir(), report) for demo in DEMOS]
