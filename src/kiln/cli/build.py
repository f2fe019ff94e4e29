"""`kiln build MODEL.onnx -o MODEL.plan`: build an engine, show progress and a build summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import kiln
from kiln.cli.errors import command
from kiln.cli.options import Device, Force, Json, Shapes, SignKey, Verbose, parse_memory_pools, parse_shapes
from kiln.cli.output import build_progress, fmt_arena, fmt_bytes, key_values, print_json, stdout
from kiln.config import Profile, ShapeRange
from kiln.engine.plan import KIND
from kiln.engine.signing import load_private_key
from kiln.errors import ConfigError
from kiln.kinds.qtype import QTYPES
from kiln.quant.calib_cache import KIND as calib_kind
from kiln.quant.report import int8_summary, ranges_table
from kiln.util import files

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
QTYPES_BY_LABEL = {q.label: q for q in QTYPES.values()}


def _flag(name: str, what: str):
    return Annotated[bool, typer.Option(f"--{name}", help=what)]


def profile_from(shapes: dict, min_shapes: dict, opt_shapes: dict, max_shapes: dict) -> tuple[Profile, ...]:
    """One optimization profile: --shapes fix inputs, --min/--max-shapes (and --opt-shapes, default max) range them."""
    if set(min_shapes) != set(max_shapes) or not set(opt_shapes) <= set(min_shapes):
        raise ConfigError("--min-shapes and --max-shapes must name the same inputs, and --opt-shapes only those")
    both = sorted(set(shapes) & set(min_shapes))
    if both:
        raise ConfigError(f"{both} given both in --shapes and in --min/--max-shapes; use one of them per input")
    profile = {n: ShapeRange(min_shapes[n], opt_shapes.get(n, max_shapes[n]), max_shapes[n]) for n in min_shapes}
    profile.update({n: ShapeRange.fixed(s) for n, s in shapes.items()})
    return (profile,) if profile else ()


def parse_layer_precisions(specs: list[str] | None) -> dict[str, str]:
    """`["conv1=fp32"]` → `{"conv1": "fp32"}`."""
    out = {}
    for spec in specs or ():
        name, sep, precision = spec.rpartition("=")
        if not sep or not name or precision not in PRECISIONS:
            raise ConfigError(f"--layer-precision {spec!r} is not NAME=PRECISION with PRECISION one of "
                              f"{', '.join(PRECISIONS)}; e.g. --layer-precision conv1=fp32")
        out[name] = precision
    return out


def summary(engine: kiln.Engine, plan: Path) -> dict:
    """What the build did, for the table and --json."""
    info = engine.build_info
    return {"plan": str(plan), "plan_bytes": plan.stat().st_size, "device": engine.device.name,
            "backend": engine.device.backend, "onnx_nodes": info.get("onnx_nodes"),
            "imported_layers": info.get("imported_layers"), "layers": info.get("layers"),
            "passes": info.get("passes", {}), "weight_bytes": engine.network.weight_bytes(),
            "arena_bytes": engine.memory_plan.arena_bytes, "arena": fmt_arena(engine.memory_plan.to_json()),
            "stage_seconds": info.get("stage_seconds", {}),
            "build_seconds": info.get("build_seconds"), "notes": info.get("notes", []),
            **(_quant_summary(info) if info.get("int8") else {})}


def _quant_summary(info: dict) -> dict:
    """The int8 / fp8 rewrite's summary, under the key "int8" or "fp8" (the precision its layers run in)."""
    q = int8_summary(info)
    return {q["precision"]: q}


def print_summary(s: dict) -> None:
    passes = ", ".join(f"{name} ×{n}" for name, n in s["passes"].items()) or "none changed the network"
    rows = [("plan", f"{s['plan']} ({fmt_bytes(s['plan_bytes'])})"), ("device", f"{s['backend']}: {s['device']}"),
            ("ONNX nodes → layers", f"{s['onnx_nodes']} → {s['layers']} (imported as {s['imported_layers']})"),
            ("passes applied", passes), ("weights", fmt_bytes(s["weight_bytes"])),
            ("activation arena", s["arena"])]
    rows += [(f"time: {stage}", f"{sec:.3f} s") for stage, sec in s["stage_seconds"].items()]
    rows.append(("time: total", f"{s['build_seconds']:.3f} s"))
    quant = next((s[k] for k in QTYPES_BY_LABEL if k in s), None)
    if quant:
        label = quant["precision"]
        rows.append((f"{label} layers", f"{quant['quantized_layers']} of {quant['quantizable_layers']} quantizable "
                                        f"layers; scales from {quant['scales_from']}"))
    rows += [("note", note) for note in s["notes"]]
    stdout().print(key_values("Build summary", rows))
    if quant and quant["ranges"]:
        stdout().print(ranges_table(quant["ranges"], QTYPES_BY_LABEL[quant["precision"]]))


@command
def build(
    model: Annotated[Path, typer.Argument(help="The ONNX model to build.", show_default=False)],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Plan file to write [default: MODEL.plan]")
                      ] = None,
    fp16: _flag("fp16", "Allow fp16 kernels.") = False,
    bf16: _flag("bf16", "Allow bf16 kernels.") = False,
    int8: _flag("int8", "Allow int8 kernels (explicit Q/DQ or calibration).") = False,
    fp8: _flag("fp8", "Quantize to fp8 e4m3 (needs --calib or --calib-cache; CUDA: compute capability 8.9+); "
                      "wins over --int8.") = False,
    tf32: _flag("tf32", "Allow tf32 matmuls and convolutions.") = False,
    shapes: Shapes = None,
    min_shapes: Annotated[Optional[list[str]], typer.Option("--min-shapes", help="Smallest input shapes.")] = None,
    opt_shapes: Annotated[Optional[list[str]], typer.Option(
        "--opt-shapes", help="Shapes to tune for [default: the max shapes].")] = None,
    max_shapes: Annotated[Optional[list[str]], typer.Option("--max-shapes", help="Largest input shapes.")] = None,
    timing_cache: Annotated[Optional[Path], typer.Option("--timing-cache", help="Timing cache file to reuse.")
                            ] = None,
    opt_level: Annotated[int, typer.Option("--opt-level", help="Tuning effort, 0..5.")] = 3,
    device: Device = "auto",
    layer_precision: Annotated[Optional[list[str]], typer.Option(
        "--layer-precision", help="Pin a layer's precision, NAME=fp32; repeatable.")] = None,
    keep_io_precision: Annotated[bool, typer.Option(
        "--keep-io-precision/--reduced-io-precision",
        help="Keep inputs and outputs in the model's declared types, or let them take the reduced precision.")
    ] = True,
    memory_pool: Annotated[Optional[list[str]], typer.Option(
        "--memory-pool", help="Most transient device memory one kernel may take, workspace=SIZE (e.g. 256M); "
                              "tactics that need more are skipped.")] = None,
    cuda_graph: Annotated[bool, typer.Option(
        "--cuda-graph/--no-cuda-graph", help="Capture the whole engine in a CUDA graph per input shape.")] = True,
    hardware_compat: Annotated[str, typer.Option(
        "--hardware-compat", help="Devices the plan must run on: none (this GPU model, fastest), same-cc (any GPU "
                                  "of this compute capability) or portable (any GPU from sm80 on).")] = "none",
    calib: Annotated[Optional[Path], typer.Option(
        "--calib", help="--int8/--fp8 calibration data: a .npz or a folder of NAME.npy (samples along axis 0).")
                                        ] = None,
    calibrator: Annotated[str, typer.Option(
        "--calibrator", help="How calibration picks a range: entropy, minmax, percentile or mse.")] = "entropy",
    calib_cache: Annotated[Optional[Path], typer.Option(
        "--calib-cache", help="Calibration cache JSON: reused when it fits (no data needed), written after "
                              "calibrating.")] = None,
    calib_batch: Annotated[int, typer.Option("--calib-batch", help="Samples per calibration batch.")] = 16,
    calib_percentile: Annotated[float, typer.Option(
        "--calib-percentile", help="The percentile calibrator's percentile.")] = 99.99,
    accuracy: Annotated[Optional[str], typer.Option(
        "--accuracy", help="--int8/--fp8 accuracy budget vs fp32: 'cosine>=X', 'max-rel<=X' or 'top1-agreement>=X'; "
                           "the most sensitive layers stay float until it holds.")] = None,
    validation: Annotated[Optional[Path], typer.Option(
        "--validation", help="The accuracy budget's validation data (.npz or folder of NAME.npy, "
                             "like --calib).")] = None,
    sign_key: SignKey = None,
    force: Force = False,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Build an engine from an ONNX model and save it as a plan file."""
    plan = output or model.with_suffix(".plan")
    if plan.resolve() == model.resolve():
        raise ConfigError(f"the plan would overwrite the model {model}; name another file with -o")
    files.check(plan, KIND, force=force, what="plan file")  # before the build, not after it
    if calib_cache:
        files.check(calib_cache, calib_kind, force=True, what="calibration cache")  # its reader refuses others
    profiles = profile_from(parse_shapes(shapes), parse_shapes(min_shapes, "--min-shapes"),
                            parse_shapes(opt_shapes, "--opt-shapes"), parse_shapes(max_shapes, "--max-shapes"))
    config = kiln.BuildConfig(fp16=fp16, bf16=bf16, int8=int8, fp8=fp8, tf32=tf32, profiles=profiles,
                              timing_cache=str(timing_cache) if timing_cache else None, opt_level=opt_level,
                              device=device, layer_precisions=parse_layer_precisions(layer_precision),
                              keep_io_precision=keep_io_precision, cuda_graph=cuda_graph,
                              workspace_bytes=parse_memory_pools(memory_pool).get("workspace"),
                              hardware_compat=hardware_compat, calib=str(calib) if calib else None,
                              calibrator=calibrator, calib_cache=str(calib_cache) if calib_cache else None,
                              calib_batch=calib_batch, calib_percentile=calib_percentile, accuracy=accuracy,
                              validation=str(validation) if validation else None)
    key = load_private_key(sign_key) if sign_key else None  # a bad key fails before the build, not after
    with build_progress(f"building {model.name}") as progress:
        engine = kiln.build(model, config, progress=progress)
    engine.save(plan, sign_key=key, force=force)
    s = summary(engine, plan)
    if as_json:
        print_json(s)
    else:
        print_summary(s)
