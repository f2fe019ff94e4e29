"""cuDNN's algorithm search runs only while kiln tunes or warms an engine, never on the run path."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from kiln.builder import autotune
from kiln.tactics.common import cudnn_search, tf32


def _benchmark_in_tf32_scope() -> bool:
    with tf32(False):
        return torch.backends.cudnn.benchmark


def test_search_is_on_only_inside_its_scope():
    before = torch.backends.cudnn.benchmark
    assert _benchmark_in_tf32_scope() is False
    with cudnn_search():
        assert _benchmark_in_tf32_scope() is True
        seen = []
        worker = threading.Thread(target=lambda: seen.append(_benchmark_in_tf32_scope()))
        worker.start()
        worker.join()
        assert seen == [False]  # a serving thread never inherits the tuner's scope
    assert _benchmark_in_tf32_scope() is False
    assert torch.backends.cudnn.benchmark == before


class _Stop(Exception):
    pass


def test_tuning_runs_inside_the_search_scope(monkeypatch):
    seen = []

    def tuner(*args, **kwargs):
        seen.append(_benchmark_in_tf32_scope())
        raise _Stop

    monkeypatch.setattr(autotune, "Autotuner", tuner)
    with pytest.raises(_Stop):
        autotune.tune_profiles(SimpleNamespace(layers=[]), {}, SimpleNamespace(backend="cuda"), 1, False, None,
                               lambda *a: None)
    assert seen == [True]
    assert _benchmark_in_tf32_scope() is False
