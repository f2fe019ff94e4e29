"""Printing: tables on stdout, progress on stderr, JSON for machines, human-readable sizes."""

from __future__ import annotations

import contextlib
import json
import math
from typing import TYPE_CHECKING, Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from kiln.builder.build import Progress as BuildProgress


def stdout() -> Console:
    return Console()


def stderr() -> Console:
    return Console(stderr=True)


def status(message: str) -> None:
    """A progress line on stderr, for terminals only (pipes and logs get results and errors alone).

    A plain line rather than a live spinner: a spinner's refresh thread would steal CPU time from timings.
    """
    console = stderr()
    if console.is_terminal:
        console.print(message, markup=False)


def print_json(obj) -> None:
    """Strict JSON on stdout, unwrapped (rich would wrap long lines): NaN becomes null, ±Inf "Infinity"/"-Infinity"."""
    typer.echo(json.dumps(finite(obj), indent=2, default=str, allow_nan=False))


def finite(obj):
    """`obj` with each non-finite float replaced, as JSON has none: NaN → None, ±Inf → "Infinity"/"-Infinity"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else "Infinity" if obj > 0 else "-Infinity"
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"


def fmt_arena(memory: dict) -> str:
    """The activation arena of a plan's memory section: size, and how many activations live in it."""
    if memory.get("arena_bytes") is None:
        return "sized at run time (dynamic shapes): activations from torch's allocator"
    placed, own = len(memory.get("offsets") or {}), memory.get("unplaced", 0)
    return (f"{fmt_bytes(memory['arena_bytes'])}: {placed} activations at planned offsets, {own} in memory their "
            "kernels allocate (cuDNN fused convs, SDPA, references)" if own else
            f"{fmt_bytes(memory['arena_bytes'])}: all {placed} activations at planned offsets")


def key_values(title: str, rows: list[tuple[str, object]]) -> Table:
    """A two-column table of labelled values."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        add_row(table, key, value)
    return table


def add_row(table: Table, *cells) -> None:
    """Add cells as plain text: tensor shapes like [batch,4] must not be read as rich markup."""
    table.add_row(*(Text(str(c)) for c in cells))


@contextlib.contextmanager
def build_progress(what: str) -> Iterator[BuildProgress]:
    """A progress bar on stderr fed by `kiln.build`'s (stage, done, total) callback; off when stderr is not a
    terminal, so that logs and pipes get only the result (or the one error line)."""
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    console = stderr()
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task(f"{what}: starting", total=None)

        def update(stage: str, done: int, total: int) -> None:
            bar.update(task, description=f"{what}: {stage}", completed=done, total=total)

        yield update
