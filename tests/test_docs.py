"""The docs cannot drift: docs/api.md is what docs/gen_api.py generates from the docstrings, and the examples of
docs/user-guide.md run (on the CPU, in a temporary folder, in the order they appear).

A fenced block right after `<!-- not-run: why -->` is skipped (GPU-only commands, downloads); every other
```python block is executed, and every `kiln ...` line of the ```shell blocks is run through typer's CliRunner and
must exit 0. The guide's ResNet-50 export is one of the skipped blocks: `tiny_model` writes a small model.onnx with
the same interface (input `input` [batch, 3, 224, 224], output `logits`) in its place.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDE = DOCS / "user-guide.md"

_FENCE = re.compile(r"^(?P<skip><!--\s*not-run:[^>]*-->\s*\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)\n```$",
                    re.DOTALL | re.MULTILINE)


def blocks(text: str) -> list[tuple[str, str, bool, int]]:
    """(language, body, skipped, line number) of every fenced block, in order."""
    return [(m["lang"], m["body"], bool(m["skip"]), text.count("\n", 0, m.start("body")) + 1)
            for m in _FENCE.finditer(text)]


def kiln_lines(body: str) -> list[list[str]]:
    """The argument lists of the `kiln ...` commands in a shell block (comments and continuations handled)."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        args = shlex.split(line, comments=True)
        if args and args[0] == "kiln":
            out.append(args[1:])
    return out


def test_api_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    gen_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_api)
    assert (DOCS / "api.md").read_text() == gen_api.generate(), \
        "docs/api.md is stale: run `python docs/gen_api.py` and commit the result"


def test_guide_marks_and_languages():
    """Every block is python, shell or a data one (plain, text, toml: not run), and every not-run marker sits on a
    block."""
    text = GUIDE.read_text()
    found = blocks(text)
    assert {lang for lang, *_ in found} <= {"python", "shell", "", "text", "toml"}
    assert len(re.findall(r"^<!-- not-run:", text, re.MULTILINE)) == sum(skip for *_, skip, _ in found)
    assert any(lang == "python" and not skip for lang, _, skip, _ in found)


def tiny_model(path: Path) -> None:
    """A small CNN with the guide's ResNet-50 interface, exported as the guide exports it."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=4, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=4, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval()
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(path), dynamo=False, input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


def test_guide_examples_run(tmp_path, monkeypatch):
    pytest.importorskip("transformers")  # the test extras: the Hugging Face export and `kiln compare`
    pytest.importorskip("onnxruntime")
    import torch
    from typer.testing import CliRunner

    from kiln.cli.app import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU, as the guide's notes say, and fast
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    tiny_model(tmp_path / "model.onnx")
    runner = CliRunner()
    namespace: dict = {"__name__": "__docs__"}
    ran, failures = 0, []
    for lang, body, skipped, line in blocks(GUIDE.read_text()):
        if skipped:
            continue
        if lang == "python":
            try:
                exec(compile(body, f"{GUIDE.name}:{line}", "exec"), namespace)
            except Exception as e:
                failures.append(f"the python block at {GUIDE.name}:{line} failed: {type(e).__name__}: {e}")
            ran += 1
        elif lang == "shell":
            for args in kiln_lines(body):
                r = runner.invoke(app, args)
                if r.exit_code != 0:
                    failures.append(f"`kiln {shlex.join(args)}` ({GUIDE.name}:{line}) exited {r.exit_code}:\n"
                                    f"{r.output}")
                ran += 1
    assert not failures, "\n\n".join(failures)
    assert ran >= 20


PAGES = sorted([*DOCS.glob("*.md"), *DOCS.glob("stories/*.md")])


def test_every_kiln_command_in_the_docs_parses():
    """Every `kiln ...` line in a fenced block of docs/ (run or not) names a command and options that exist: each is
    parsed by the command's own parser, which refuses unknown commands and options and malformed values."""
    import typer

    from kiln.cli.app import app

    root = typer.main.get_command(app)
    context = type(root.make_context("kiln", ["--help"], resilient_parsing=True))  # typer's click, vendored or not
    checked, bad = 0, []
    for page in PAGES:
        for _, body, _, line in blocks(page.read_text()):
            for part in (p for raw in body.replace("\\\n", " ").splitlines() for p in raw.split(";")):
                if not part.strip().startswith("kiln "):
                    continue
                args = shlex.split(part, comments=True)
                if args[1:2] in (["--version"], ["--help"]):
                    continue
                cmd, rest, ctx = root, args[1:], context(root, info_name="kiln")
                try:
                    while hasattr(cmd, "get_command"):  # a group: descend to the sub-command
                        sub = cmd.get_command(ctx, rest[0]) if rest else None
                        if sub is None:
                            raise LookupError(f"no such command: {rest[:1]}")
                        cmd, ctx, rest = sub, context(sub, info_name=rest[0], parent=ctx), rest[1:]
                    cmd.make_context(ctx.info_name, rest, parent=ctx.parent)
                    checked += 1
                except Exception as e:  # click's UsageError / NoSuchOption / BadParameter
                    message = e.format_message() if hasattr(e, "format_message") else str(e)
                    bad.append(f"{page.relative_to(DOCS)}:{line}: `{part.strip()}`: {message}")
    assert not bad, "\n".join(bad)
    assert checked >= 40
