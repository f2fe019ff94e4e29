"""The `kiln` command: one sub-command per module of this package."""

from __future__ import annotations

from typing import Annotated

import typer

from kiln.cli import (bench, build, compare, conformance, debug, demo, inspect, keygen, loadgen, profile, retune, run,
                      serve)
from kiln.cli.options import ProfileCommand
from kiln.version import __version__

app = typer.Typer(name="kiln", help="kiln: ONNX models in, fast device-tuned engines out.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
app.command("build", cls=ProfileCommand)(build.build)
app.command("run")(run.run)
app.command("inspect")(inspect.inspect)
app.command("bench", cls=ProfileCommand)(bench.bench)
app.command("demo")(demo.demo)
app.command("conformance")(conformance.conformance)
app.command("compare")(compare.compare)
app.add_typer(debug.app, name="debug")
app.command("profile", cls=ProfileCommand)(profile.profile)
app.command("retune")(retune.retune)
app.command("keygen")(keygen.keygen)
app.command("serve", epilog=serve.CONFIG_HELP)(serve.serve)
app.command("loadgen")(loadgen.loadgen)


def _print_version(value: bool) -> None:
    if value:
        import onnx
        import torch

        typer.echo(f"kiln {__version__} (torch {torch.__version__}, onnx {onnx.__version__})")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print kiln's version and exit.")] = False) -> None:
    """kiln: ONNX models in, fast device-tuned engines out."""


def main() -> None:
    app(prog_name="kiln")
