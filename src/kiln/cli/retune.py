"""`kiln retune PLAN -o NEW.plan [--timing-cache C]`: re-tune a plan for this device and save it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kiln.cli.errors import command
from kiln.cli.options import Force, Json, SignKey, VerifyKey, Verbose
from kiln.cli.output import build_progress, fmt_bytes, key_values, print_json, stdout
from kiln.engine.signing import load_private_key
from kiln.errors import ConfigError
from kiln.util import files


@command
def retune(
    plan: Annotated[Path, typer.Argument(help="The plan to re-tune.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the re-tuned plan.",
                                         show_default=False)],
    timing_cache: Annotated[Optional[Path], typer.Option(
        "--timing-cache", help="Timing cache file to read and fill (re-tuning with it takes seconds).")] = None,
    sign_key: SignKey = None,
    verify_key: VerifyKey = None,
    force: Force = False,
    verbose: Verbose = False,
    as_json: Json = False,
) -> None:
    """Re-run the autotuner for a plan's layers on this device (its network is already optimized), and save it
    with this device's fingerprint."""
    if output.resolve() == plan.resolve():
        raise ConfigError(f"-o {output} would overwrite the plan being re-tuned; name another file")
    from kiln.cli.inputs import load_plan
    from kiln.engine.plan import KIND

    files.check(output, KIND, force=force, what="plan file")  # before re-tuning, not after it
    key = load_private_key(sign_key) if sign_key else None
    with build_progress(f"re-tuning {plan.name}") as progress:
        engine = load_plan(plan, "retune", verify_key, timing_cache=timing_cache, force_retune=True,
                           progress=progress)
    engine.save(output, sign_key=key, force=force)
    info = dict(engine.build_info.get("retune") or {})
    s = {"plan": str(output), "plan_bytes": output.stat().st_size, "device": engine.device.name,
         "tuned_before_on": info.get("from"), "differences": info.get("differences", []),
         "layers": info.get("layers"), "profiles": engine.profile_count, "tactics_changed": info.get("changed"),
         "seconds": info.get("seconds"),
         "timing_cache": info.get("timing_cache"), "signed": key is not None}
    if as_json:
        print_json(s)
        return
    rows = [("plan", f"{s['plan']} ({fmt_bytes(s['plan_bytes'])})"), ("device", s["device"]),
            ("tuned before on", s["tuned_before_on"]),
            ("layers", f"{s['layers']} ({s['tactics_changed']} changed tactic or config)"),
            ("optimization profiles", f"{s['profiles']}, each re-tuned"),
            ("time", f"{s['seconds']:.3f} s")]
    if s["timing_cache"]:
        tc = s["timing_cache"]
        rows.append(("timing cache", f"{tc['path']}: {tc['hits']} hits, {tc['misses']} misses"))
    rows += [("difference", d) for d in s["differences"]]
    stdout().print(key_values("Re-tune summary", rows))
