"""`kiln keygen -o KEY`: a new Ed25519 key pair for signing plans (KEY, private) and verifying them (KEY.pub)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kiln.cli.errors import command
from kiln.cli.options import Verbose


@command
def keygen(
    output: Annotated[Path, typer.Option("--output", "-o", help="Private key file to write; the public key goes "
                                                                "to the same name + .pub.", show_default=False)],
    verbose: Verbose = False,
) -> None:
    """Create a key pair: sign plans with `kiln build --sign-key KEY`, verify them with `--verify-key KEY.pub`."""
    from kiln.engine.signing import generate

    private, public = generate(output)
    typer.echo(f"wrote {private} (private: keep it secret; sign with --sign-key {private})")
    typer.echo(f"wrote {public} (public: load with --verify-key {public})")
