"""`kiln conformance`: run ONNX's backend test suite through kiln, show progress and totals, write the table."""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from kiln.target.device import detect
from kiln.cli.errors import command
from kiln.cli.options import Device, Force, Verbose
from kiln.cli.output import key_values, stderr, stdout
from kiln.conformance import Outcome, run_suite
from kiln.conformance.suite import CATEGORIES
from kiln.conformance.table import KIND, write_markdown
from kiln.errors import ConfigError
from kiln.util import files

STATUSES = ("passed", "failed", "error", "excluded", "skipped")


def _check_patterns(patterns: list[str]) -> None:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise ConfigError(f"--include {p!r} is not a valid regular expression ({e})") from None


@command
def conformance(
    device: Device = "cpu",
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the per-op Markdown table to this file.")
                   ] = None,
    include: Annotated[Optional[list[str]], typer.Option(
        "--include", help="Only tests whose name (e.g. test_relu_cpu) matches this regular expression; "
                          "repeatable.")] = None,
    category: Annotated[Optional[list[str]], typer.Option(
        "--category", help=f"Test categories to run [default: node]; of {', '.join(CATEGORIES.values())}.")
                        ] = None,
    force: Force = False,
    verbose: Verbose = False,
) -> None:
    """Run the ONNX backend node tests through kiln and report how many pass, per op with --out."""
    backend = detect(device).backend
    categories = category or ["node"]
    unknown = sorted(set(categories) - set(CATEGORIES.values()))
    if unknown:
        raise ConfigError(f"unknown --category {unknown}; choose from {', '.join(CATEGORIES.values())}")
    _check_patterns(include or [])
    if out and out.parent.is_dir():  # before the suite runs; a missing folder is made
        files.check(out, KIND, force=force, what="conformance table")
    counts: collections.Counter = collections.Counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    console = stderr()
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task("conformance: loading the suite", total=None)

        def on_outcome(o: Outcome) -> None:
            counts[o.status] += 1
            bar.update(task, description=f"conformance on {backend}: {sum(counts.values())} run, "
                                         f"{counts['passed']} passed · {o.name}")

        outcomes = run_suite(backend.upper(), include or [], categories, progress=on_outcome)
    if not outcomes:
        raise ConfigError(f"no backend test matches --include {include}; test names end in the device, "
                          f"e.g. test_relu_{backend}")
    rows = [(status, counts[status]) for status in STATUSES if counts[status]]
    rows.append(("total", len(outcomes)))
    if out:
        rows.append(("table written to", write_markdown(outcomes, out, backend.upper(), force)))
    stdout().print(key_values(f"ONNX conformance on {backend}", rows))
