"""Shared pytest setup: the gpu marker skips cleanly on machines without CUDA."""

import os
import sys
from pathlib import Path

import pytest
import torch

# tests/ mirrors src/kiln/ in folders; shared helpers (opcheck, passcheck, models) sit in tests/ and test modules import
# each other by file name (`from test_cli import invoke`), so every test folder is on the import path
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)] + sorted(str(d) for d in HERE.iterdir() if d.is_dir() and any(d.glob("test_*.py")))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if not torch.cuda.is_available():  # Triton kernels run on the CPU through the interpreter (read at decoration)
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _lang_state() -> list[tuple[object, dict]]:
    """triton.language's namespaces as they are before any kernel is interpreted."""
    try:
        import triton.language as tl
    except ImportError:  # pragma: no cover
        return []
    return [(o, dict(vars(o))) for o in (tl, tl.core, tl.math, tl.tensor, tl.core.tensor_descriptor_base)]


_LANG = _lang_state()


@pytest.fixture(autouse=True)
def _undo_interpreter_patches():
    """Put triton.language back after each test: triton's interpreter patches it for a jit helper called from an
    interpreted kernel and never restores it, and a Gluon compile (the sm90 AOT tests) then fails on the leftovers."""
    yield
    for obj, saved in _LANG:
        for name, value in saved.items():
            if vars(obj).get(name, value) is not value:
                setattr(obj, name, value)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
