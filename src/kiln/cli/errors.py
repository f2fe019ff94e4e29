"""How every command fails: one `error: ...` line on stderr and an exit code; a traceback only with --verbose."""

from __future__ import annotations

import functools
import traceback

import click
import typer

from kiln.errors import InternalError, KilnError

BUG = "this is a bug in kiln; please report it with the command and model that triggered it"


def one_line(e: BaseException) -> str:
    """The exception's message on one line."""
    return " ".join(str(e).split()) or type(e).__name__


def command(fn):
    """Wrap a command: KilnError → its exit code, InternalError and stray exceptions → 70, OSError and
    MemoryError (the user's environment) → 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, typer.Exit, click.ClickException, click.Abort):
            raise
        except KilnError as e:
            fail(f"error: {one_line(e)}", e.exit_code, kwargs.get("verbose", False))
        except OSError as e:  # disk full, permission denied: the user's environment, not kiln
            fail(f"error: {one_line(e)}", 1, kwargs.get("verbose", False))
        except MemoryError as e:
            fail(f"error: out of host memory ({one_line(e)}); use smaller --shapes or inputs", 1,
                 kwargs.get("verbose", False))
        except InternalError as e:
            fail(f"error: {BUG}: {one_line(e)}", InternalError.exit_code, kwargs.get("verbose", False))
        except Exception as e:
            fail(f"error: {BUG}: {type(e).__name__}: {one_line(e)}", InternalError.exit_code,
                 kwargs.get("verbose", False))

    return wrapper


def fail(message: str, code: int, verbose: bool) -> None:
    """Print the traceback (verbose only) and the message, then exit with `code`."""
    if verbose:
        traceback.print_exc()
    typer.echo(message, err=True)
    raise typer.Exit(code)
