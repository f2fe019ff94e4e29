"""Options several commands share, and the parsing of their values into kiln's types."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from kiln.config import MAX_DIM
from kiln.errors import ConfigError

Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show the traceback of an error.")]
Json = Annotated[bool, typer.Option(
    "--json", help='Print machine-readable JSON on stdout instead of tables. Strict JSON: a NaN number is null, '
                   '+Inf and -Inf are the strings "Infinity" and "-Infinity".')]
Shapes = Annotated[Optional[list[str]], typer.Option(
    "--shapes", help="Input shapes, name:1x3x224x224[,name2:...]; repeatable.")]
Device = Annotated[str, typer.Option("--device", help="auto (the best device present), cpu or cuda.")]
Seed = Annotated[int, typer.Option("--seed", min=0, help="Seed of the random inputs made when none are given.")]
Policy = Annotated[str, typer.Option(
    "--policy", help="For a plan built on another GPU model or software versions: strict (refuse, naming each "
                     "difference), warn (run it, saying what differs) or retune (re-tune it for this device).")]
VerifyKey = Annotated[Optional[Path], typer.Option(
    "--verify-key", help="Public key file (KEY.pub from `kiln keygen`): refuse plans not signed by its key.")]
SignKey = Annotated[Optional[Path], typer.Option(
    "--sign-key", help="Sign the plan written with this Ed25519 private key (from `kiln keygen`).")]
ModelPath = Annotated[Path, typer.Argument(help="A plan file, or an .onnx model to build on the fly.",
                                           show_default=False)]
Force = Annotated[bool, typer.Option(
    "--force", help="Replace existing output files that kiln did not write (without it kiln replaces only its own "
                    "files of the same kind, and refuses links, devices and pipes always).")]

Nvtx = Annotated[bool, typer.Option(
    "--nvtx", help="Wrap each layer's launch in an NVTX range named kiln:LAYER (KIND), for Nsight Systems (nsys "
                   "profile). NVTX ranges are recorded at launch, so the layers then run eagerly, without CUDA graph "
                   "replay. No effect on the CPU backend.")]
Plugin = Annotated[Optional[list[str]], typer.Option(
    "--plugin", help="A Python file (my_ops.py) or module that registers custom ops with kiln.plugins.register_op, "
                     "imported before the command runs; repeatable. A plan records the plugin ops it uses and the "
                     "module each came from (name, file name, sha256), but kiln never imports what a plan names: "
                     "to load such a plan, pass the same --plugin again (another sha256 than the recorded one is "
                     "a warning).")]

_DIMS = re.compile(r"^\d+(x\d+)*$")


def parse_shapes(specs: list[str] | None, option: str = "--shapes") -> dict[str, tuple[int, ...]]:
    """`["x:1x3x8x8,y:2"]` → `{"x": (1, 3, 8, 8), "y": (2,)}`; an empty shape after the colon is a scalar."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        for item in spec.split(","):
            name, sep, dims = item.strip().rpartition(":")
            if not sep or not name or not (dims == "" or _DIMS.match(dims)):
                raise ConfigError(f"{option} {item.strip()!r} is not name:DIMS; write e.g. input:1x3x224x224 "
                                  "(several inputs separated by commas)")
            if name in shapes:
                raise ConfigError(f"{option} gives input {name!r} twice")
            shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
            if any(d > MAX_DIM for d in shapes[name]):
                raise ConfigError(f"{option} {item.strip()!r}: a dimension is over {MAX_DIM}, the int64 limit; "
                                  "give the real size of the input")
    return shapes


def nvtx_on(nvtx: bool, engine) -> bool:
    """--nvtx for `engine`: as given on CUDA; on the CPU backend False, after a one-line note on stderr."""
    if nvtx and engine.device.backend != "cuda":
        typer.echo("note: --nvtx has no effect on the CPU backend (no CUDA)", err=True)
        return False
    return nvtx


def load_plugins(specs: list[str] | None) -> None:
    """Import each --plugin (a file or module registering ops through kiln.plugins); a bad one is a ConfigError."""
    if specs:
        from kiln.plugins import load_plugin

        for spec in specs:
            load_plugin(spec)

def is_onnx(path: Path) -> bool:
    return path.suffix.lower() == ".onnx"


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_memory_pools(specs: list[str] | None) -> dict[str, int]:
    """`["workspace=256M"]` (or trtexec's `workspace:256M`) → `{"workspace": 268435456}`; K/M/G are powers of 1024."""
    pools: dict[str, int] = {}
    for spec in specs or ():
        for item in spec.split(","):
            name, sep, size = item.strip().replace(":", "=", 1).partition("=")
            m = _SIZE.match(size.strip())
            if not sep or name != "workspace" or not m:
                raise ConfigError(f"--memory-pool {item.strip()!r} is not workspace=SIZE; write e.g. "
                                  "--memory-pool workspace=256M (K, M, G: powers of 1024)")
            pools[name] = int(float(m.group(1)) * _UNITS[(m.group(2) or "")[:1].upper()])
    return pools


# -- build flags: `kiln build`, and `kiln bench` / `kiln profile` on an .onnx (which build it first) --------------
def _flag(name: str, what: str):
    return Annotated[bool, typer.Option(f"--{name}", help=what)]


Fp16 = _flag("fp16", "Allow fp16 kernels.")
Bf16 = _flag("bf16", "Allow bf16 kernels.")
Int8 = _flag("int8", "Allow int8 kernels (explicit Q/DQ or calibration).")
Fp8 = _flag("fp8", "Quantize to fp8 e4m3 (needs --calib or --calib-cache; CUDA: compute capability 8.9+); wins over "
                   "--int8.")
Tf32 = _flag("tf32", "Allow tf32 matmuls and convolutions.")
MinShapes = Annotated[Optional[list[str]], typer.Option("--min-shapes", help="Smallest input shapes.")]
OptShapes = Annotated[Optional[list[str]], typer.Option("--opt-shapes", help="Shapes to tune for [default: the max "
                                                                             "shapes].")]
MaxShapes = Annotated[Optional[list[str]], typer.Option("--max-shapes", help="Largest input shapes.")]


def _triple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else value


Profiles = Annotated[Optional[list[tuple]], typer.Option(
    "--profile", parser=_triple,
    help="One optimization profile: its MIN OPT MAX shapes, each name:1x16[,name2:1x16]; repeatable (as trtexec's "
         "profiles), each tuned at its opt shapes. --min/--opt/--max-shapes add one more profile, the first; inputs "
         "fixed by --shapes are in every profile.")]


class ProfileCommand(TyperCommand):
    """A command whose --profile option takes three values (MIN OPT MAX), which typer cannot declare."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name == "profile":
                param.nargs, param.metavar = 3, "MIN OPT MAX"


ShapeBuckets = Annotated[int, typer.Option(
    "--shape-buckets", metavar="N",
    help="Split each dynamic profile into up to N (1..16) batch buckets, one tactic table per bucket, each tuned at "
         "its own opt shape (the bucket's max, or your opt where it falls inside); the engine picks the bucket "
         "holding each run's shapes. Needs --profile or --min/--max-shapes. 1: off.")]
TimingCache = Annotated[Optional[Path], typer.Option("--timing-cache", help="Timing cache file to reuse.")]
OptLevel = Annotated[int, typer.Option(
    "--opt-level", help="Tuning effort, 0..5 (default 3): up to 1, 1, 2, 8, 32 or all configs per tactic; 0 takes "
                        "each layer's first tactic that passes its check, 1-5 time them; 4 and 5 also try tactics "
                        "superseded on this GPU (the portable int8 convs where the Hopper ones run).")]
LayerPrecision = Annotated[Optional[list[str]], typer.Option(
    "--layer-precision", help="Pin a layer's precision, NAME=fp32; repeatable.")]
KeepIoPrecision = Annotated[bool, typer.Option(
    "--keep-io-precision/--reduced-io-precision",
    help="Keep inputs and outputs in the model's declared types, or let them take the reduced precision.")]
MemoryPool = Annotated[Optional[list[str]], typer.Option(
    "--memory-pool", help="Most transient device memory one kernel may take, workspace=SIZE (e.g. 256M); tactics "
                          "that need more are skipped.")]
HardwareCompatOption = Annotated[str, typer.Option(
    "--hardware-compat", help="Devices the plan must run on: none (this GPU model, fastest), same-cc (any GPU of "
                              "this compute capability) or portable (any GPU from sm80 on).")]
Calib = Annotated[Optional[Path], typer.Option(
    "--calib", help="--int8/--fp8 calibration data: a .npz or a folder of NAME.npy (samples along axis 0).")]
Calibrator = Annotated[str, typer.Option(
    "--calibrator", help="How calibration picks a range: entropy, minmax, percentile or mse.")]
CalibCache = Annotated[Optional[Path], typer.Option(
    "--calib-cache", help="Calibration cache JSON: reused when it fits (no data needed), written after calibrating.")]
CalibBatch = Annotated[int, typer.Option("--calib-batch", help="Samples per calibration batch.")]
CalibPercentile = Annotated[float, typer.Option("--calib-percentile", help="The percentile calibrator's percentile.")]
SmoothAlpha = Annotated[float, typer.Option(
    "--smooth-alpha", help="SmoothQuant strength in (0, 1] for --int8/--fp8 GEMM inputs with outlier channels "
    "(transformers; 0.5-0.8 is usual); 0: off.")]
Accuracy = Annotated[Optional[str], typer.Option(
    "--accuracy", help="--int8/--fp8 accuracy budget vs fp32: 'cosine>=X', 'max-rel<=X' or 'top1-agreement>=X'; the "
                       "most sensitive layers stay float until it holds.")]
Validation = Annotated[Optional[Path], typer.Option(
    "--validation", help="The accuracy budget's validation data (.npz or folder of NAME.npy, like --calib).")]
InputFiles = Annotated[Optional[list[str]], typer.Option(
    "--input", "-i", help="name=file.npy for one input, or file.npz for several; repeatable. Their shapes are the "
                          "run's (an .onnx is built for them); inputs not given are random.")]
