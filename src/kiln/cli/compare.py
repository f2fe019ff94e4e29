"""`kiln compare MODEL.onnx`: kiln's outputs against ONNX Runtime's on the same inputs, PASS/FAIL per output."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

import kiln
from kiln.cli.build import parse_layer_precisions
from kiln.cli.errors import command
from kiln.cli.inputs import load_inputs, load_plan, random_feeds, safe_stem
from kiln.cli.options import Device, Force, Json, Policy, Seed, Shapes, Verbose, VerifyKey, parse_shapes
from kiln.cli.options import Plugin, load_plugins
from kiln.cli.output import add_row, build_progress, print_json, status, stdout
from kiln.errors import ConfigError, InputError, ModelError
from kiln.util import files

if TYPE_CHECKING:
    import numpy as np

    from kiln.accuracy.compare import Comparison
    from kiln.accuracy.metrics import Tolerance

OnnxModel = Annotated[Path, typer.Argument(help="The ONNX model (ONNX Runtime runs it as the reference).",
                                           show_default=False)]
Inputs = Annotated[Optional[list[str]], typer.Option(
    "--input", "-i", help="name=file.npy for one input, or file.npz for all; repeatable [default: random].")]
InputsDir = Annotated[Optional[Path], typer.Option("--inputs-dir", help="Folder holding one NAME.npy per input.")]
Rtol = Annotated[Optional[float], typer.Option("--rtol", help="Relative tolerance [default: by precision].")]
Atol = Annotated[Optional[float], typer.Option("--atol", help="Absolute tolerance [default: by precision].")]
Cosine = Annotated[Optional[float], typer.Option(
    "--cosine", help="Pass when each output's cosine similarity to the reference is at least this, e.g. 0.999 "
                     "(instead of --rtol/--atol).")]
# .npz archives kiln writes: a zip whose first member is an .npy array
NPZ = files.Kind(".npz archive", "outputs.npz", lambda head: head.startswith(b"PK\x03\x04") and b".npy" in head[:512])


def require_model(model: Path) -> None:
    if not model.is_file():
        raise ModelError(f"model file {model} does not exist; give the path of an .onnx file")


def feeds_for(engine: kiln.Engine, inputs: list[str] | None, inputs_dir: Path | None,
              shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Inputs from --input files, or one NAME.npy per input in --inputs-dir, else random ones made with `seed`."""
    if inputs and inputs_dir:
        raise ConfigError("give inputs with --input or with --inputs-dir, not both")
    if inputs:
        return load_inputs(inputs, engine)
    if inputs_dir is None:
        return random_feeds(engine, shapes, seed)
    if not inputs_dir.is_dir():
        raise InputError(f"--inputs-dir {inputs_dir} is not a folder")
    files = {t.name: inputs_dir / f"{safe_stem(t.name)}.npy" for t in engine.inputs}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise InputError(f"--inputs-dir lacks {', '.join(missing)}; save one array per input with numpy.save")
    return load_inputs([f"{name}={file}" for name, file in files.items()], engine)


def default_tolerance(config: kiln.BuildConfig, rtol: float | None, atol: float | None,
                      cosine: float | None = None) -> Tolerance:
    """--cosine, or --rtol/--atol, each defaulting to the tolerance of the lowest precision the build allowed."""
    from kiln.accuracy.metrics import DEFAULT_TOLERANCES, Tolerance

    if cosine is not None:
        if rtol is not None or atol is not None:
            raise ConfigError("give --cosine or --rtol/--atol, not both")
        if not 0 < cosine <= 1:
            raise ConfigError(f"--cosine must be in (0, 1], e.g. 0.999; got {cosine}")
        return Tolerance(0.0, 0.0, cosine)
    key = "bf16" if config.bf16 else "fp16" if config.fp16 else "tf32" if config.tf32 else "fp32"
    r, a = DEFAULT_TOLERANCES[key]
    tol = Tolerance(r if rtol is None else rtol, a if atol is None else atol)
    if tol.rtol < 0 or tol.atol < 0:
        raise ConfigError("--rtol and --atol must be 0 or more")
    return tol


def open_for_compare(model: Path | None, plan: Path | None, config: kiln.BuildConfig, policy: str = "strict",
                     verify_key: Path | None = None) -> kiln.Engine:
    """The engine under test: the --plan (which must come from `model`), else `model` built with `config`."""
    if plan is not None:
        if config.fp16 or config.bf16 or config.tf32 or config.layer_precisions:
            raise ConfigError("build options (--fp16, --bf16, --tf32, --layer-precision) do not apply to a --plan; "
                              "drop them, or drop --plan to build the model with them")
        engine = load_plan(plan, policy, verify_key)
        if (model is not None and engine.source_sha256
                and engine.source_sha256 != hashlib.sha256(model.read_bytes()).hexdigest()):
            raise ConfigError(f"{plan} was built from another model than {model}; compare it with its own model")
        return engine
    with build_progress(f"building {model.name}") as progress:
        return kiln.build(model, config, progress)


def fmt(x: float) -> str:
    return "-" if x != x else f"{x:.3g}"


def exit_status(fn):
    """Exit 1 when the command returns False (a FAIL verdict). Outside `command`, which treats any exception
    raised inside it, typer.Exit included, as a bug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if fn(*args, **kwargs) is False:
            raise typer.Exit(1)

    return wrapper


def print_comparison(result: Comparison, net, title: str = "kiln vs ONNX Runtime") -> None:
    """One row per output (errors as max / mean / median), the first bad layer with --mark-all, a verdict."""
    table = Table(title=title, title_justify="left")
    for col in ("output", "abs error max/mean/median", "rel error max/mean/median", "cosine", "NaN/Inf ref, kiln",
                "tolerance", "result"):
        table.add_column(col, overflow="fold")
    for name, m in result.outputs.items():
        add_row(table, name, " / ".join(map(fmt, (m.max_abs, m.mean_abs, m.median_abs))),
                " / ".join(map(fmt, (m.max_rel, m.mean_rel, m.median_rel))),
                "-" if m.cosine != m.cosine else f"{m.cosine:.6f}", f"{m.nan_ref}/{m.inf_ref}, {m.nan_got}/{m.inf_got}",
                result.tolerances[name], "PASS" if m.passed else "FAIL")
    stdout().print(table)
    for name, m in result.outputs.items():
        if m.note:
            typer.echo(f"{name}: {m.note}")
    if result.first_bad:
        layer, tensor = result.first_bad
        m = result.intermediates.get(tensor) or result.outputs[tensor]
        kind = next(l.kind for l in net.layers if l.name == layer)
        typer.echo(f"first layer beyond tolerance: {layer} ({kind}), tensor {tensor}: max abs error "
                   f"{fmt(m.max_abs)}, cosine {fmt(m.cosine)}{', ' + m.note if m.note else ''} "
                   f"({len(result.intermediates)} intermediate tensors compared)")
    elif result.intermediates:
        typer.echo(f"all {len(result.intermediates)} intermediate tensors within tolerance")
    failed = sum(not m.passed for m in result.outputs.values())
    typer.echo(f"{'FAILED' if failed else 'PASSED'}: {len(result.outputs) - failed} of {len(result.outputs)} "
               "outputs within tolerance")


def save_outputs_npz(outputs: dict, path: Path, force: bool) -> None:
    """--save-outputs: every output (sequences as NAME[i]) in one .npz, never pickled, under kiln's write policy."""
    import zipfile

    import numpy as np

    from kiln.accuracy.compare import flatten

    def write(f) -> None:
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, value in flatten(outputs).items():
                value = np.asarray(value)
                with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, value.astype(str) if value.dtype == object else value,
                                              allow_pickle=False)

    files.write(path, write, NPZ, force=force, what="--save-outputs file")


def reference_outputs(against: Path | None, load_outputs: Path | None, engine: kiln.Engine, feeds: dict,
                      policy: str, verify_key: Path | None) -> tuple[dict, str]:
    """The reference that is not ONNX Runtime: another plan's outputs on `feeds`, or outputs saved earlier."""
    if against is not None:
        other = load_plan(against, policy, verify_key)
        names, theirs = [t.name for t in engine.inputs], [t.name for t in other.inputs]
        if sorted(names) != sorted(theirs):
            raise ConfigError(f"--against {against} takes inputs {theirs}, the --plan {names}; compare plans of the "
                              "same model")
        return other.create_context().run(feeds), str(against)
    from kiln.util.npyio import read_npz

    return read_npz(load_outputs), str(load_outputs)


@exit_status
@command
def compare(
    model: Annotated[Optional[Path], typer.Argument(
        help="The ONNX model (ONNX Runtime runs it as the reference); optional with --plan and --against or "
             "--load-outputs.", show_default=False)] = None,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Test this plan instead of building the model.")
                    ] = None,
    against: Annotated[Optional[Path], typer.Option(
        "--against", help="Reference: this plan run on the same inputs, instead of ONNX Runtime (with --plan).")
                       ] = None,
    save_outputs: Annotated[Optional[Path], typer.Option(
        "--save-outputs", help="Also save the tested engine's outputs to this .npz (kiln's write policy).")] = None,
    load_outputs: Annotated[Optional[Path], typer.Option(
        "--load-outputs", help="Reference: outputs saved with --save-outputs, instead of ONNX Runtime; give the "
                               "same --input (or --seed and --shapes).")] = None,
    fp16: Annotated[bool, typer.Option("--fp16", help="Build with fp16 kernels allowed.")] = False,
    bf16: Annotated[bool, typer.Option("--bf16", help="Build with bf16 kernels allowed.")] = False,
    tf32: Annotated[bool, typer.Option("--tf32", help="Build with tf32 matmuls allowed.")] = False,
    layer_precision: Annotated[Optional[list[str]], typer.Option(
        "--layer-precision", help="Pin a layer's precision, NAME=fp32; repeatable.")] = None,
    opt_level: Annotated[int, typer.Option("--opt-level", help="Tuning effort, 0..5.")] = 3,
    inputs: Inputs = None,
    inputs_dir: InputsDir = None,
    shapes: Shapes = None,
    seed: Seed = 0,
    rtol: Rtol = None,
    atol: Atol = None,
    cosine: Cosine = None,
    tol: Annotated[Optional[list[str]], typer.Option(
        "--tol", help="Per-output tolerance OUTPUT=RTOL,ATOL; repeatable.")] = None,
    mark_all: Annotated[bool, typer.Option(
        "--mark-all", help="Compare every intermediate tensor too and name the first layer beyond tolerance.")
                        ] = False,
    device: Device = "auto",
    policy: Policy = "strict",
    verify_key: VerifyKey = None,
    force: Force = False,
    plugin: Plugin = None,
    verbose: Verbose = False,
    as_json: Json = False,
) -> bool:
    """Run kiln and a reference (ONNX Runtime, another plan, or saved outputs) on the same inputs and compare
    outputs; exit 1 when any is beyond tolerance."""
    load_plugins(plugin)
    from kiln.accuracy.compare import compare_engine, compare_outputs
    from kiln.accuracy.metrics import parse_tolerance

    if against is not None and load_outputs is not None:
        raise ConfigError("give one reference: --against PLAN or --load-outputs FILE, not both")
    if against is not None and plan is None:
        raise ConfigError("--against compares two plans: give the plan to test with --plan")
    if model is None and plan is None:
        raise ConfigError("give the ONNX model to build and compare, or a plan with --plan")
    if model is None and against is None and load_outputs is None:
        raise ConfigError("ONNX Runtime, the default reference, needs the ONNX model; give it, or a reference with "
                          "--against PLAN or --load-outputs FILE")
    if mark_all and (against is not None or load_outputs is not None):
        raise ConfigError("--mark-all compares intermediate tensors with ONNX Runtime's; drop --against / "
                          "--load-outputs, or --mark-all")
    if model is not None:
        require_model(model)
    if load_outputs is not None:
        files.existing_file(load_outputs, "--load-outputs file", InputError)
    if save_outputs is not None:
        files.check(save_outputs, NPZ, force=force, what="--save-outputs file")  # before anything runs
    per_output = dict(parse_tolerance(spec) for spec in tol or ())
    shape_map = parse_shapes(shapes)
    config = kiln.BuildConfig.with_shapes(shape_map, fp16=fp16, bf16=bf16, tf32=tf32, opt_level=opt_level,
                                          device=device, layer_precisions=parse_layer_precisions(layer_precision))
    engine = open_for_compare(model, plan, config, policy, verify_key)
    default = default_tolerance(engine.config, rtol, atol, cosine)
    feeds = feeds_for(engine, inputs, inputs_dir, shape_map, seed)
    if against is None and load_outputs is None:
        status("running kiln and ONNX Runtime ...")
        result = compare_engine(engine, model, feeds, default, per_output, every_tensor=mark_all)
        title = "kiln vs ONNX Runtime"
        got = None
    else:
        status("running kiln ...")
        got = engine.create_context().run(feeds)
        ref, what = reference_outputs(against, load_outputs, engine, feeds, policy, verify_key)
        result = compare_outputs(ref, {n: got[n] for n in engine.network.outputs}, default, per_output, what)
        title = f"{plan} vs {what}"
    if save_outputs is not None:
        got = got if got is not None else engine.create_context().run(feeds)
        save_outputs_npz({n: got[n] for n in engine.network.outputs}, save_outputs, force)
    if as_json:
        outputs = {n: dict(m.to_json(), tolerance=str(result.tolerances[n])) for n, m in result.outputs.items()}
        print_json({"passed": result.passed, "reference": title.partition(" vs ")[2], "outputs": outputs,
                    "intermediates": {n: m.to_json() for n, m in result.intermediates.items()},
                    "first_bad": dict(zip(("layer", "tensor"), result.first_bad)) if result.first_bad else None})
    else:
        print_comparison(result, engine.network, title)
    return result.passed
